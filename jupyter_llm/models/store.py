"""Ollama's on-disk layout: ``manifests/<host>/<ns>/<name>/<tag>`` JSON and
``blobs/sha256-<hex>``. The same directory can be shared with Ollama.

Every write goes to a temporary file first and is renamed into place only when
complete, so a crash never leaves a half-written blob or manifest behind.
Manifest writes (with the blobs they reference) and blob collection happen
under the store lock, shared by every thread and process using the directory;
collection also spares the blobs a pull holds, and stops at any manifest it
cannot read. All methods block: call them from an executor in the server.

A blob uploaded with ``POST /api/blobs`` is held for its ``/api/create``:
until a create of this store uses it, or ``UPLOAD_HOLD`` seconds (an hour:
an upload is followed by its create within seconds, and a client that never
sends one must not keep a blob from collection for ever). At most
``MAX_UPLOAD_HOLDS`` uploads are held at once; past that the soonest to
expire lets go first, so holds stay small however many blobs are uploaded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from jupyter_llm.models.draft import MEDIA_DRAFT, check_vocabulary
from jupyter_llm.models.gguf_info import GGUFInfo, read_gguf_info
from jupyter_llm.models.holds import BlobHolds, Hold, HoldUnreadable
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.models.store_lock import store_lock
from jupyter_llm.request.errors import InvalidRequest, ModelNotFound
from jupyter_llm.request.limits import TEXT_LAYER
from jupyter_llm.request.options import model_params

log = logging.getLogger(__name__)

MEDIA_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_MODEL = "application/vnd.ollama.image.model"
MEDIA_TEMPLATE = "application/vnd.ollama.image.template"
MEDIA_SYSTEM = "application/vnd.ollama.image.system"
MEDIA_PARAMS = "application/vnd.ollama.image.params"
MEDIA_LICENSE = "application/vnd.ollama.image.license"
MEDIA_MESSAGES = "application/vnd.ollama.image.messages"
MEDIA_PROJECTOR = "application/vnd.ollama.image.projector"  # a vision model's mmproj GGUF
REPLACEABLE = (MEDIA_TEMPLATE, MEDIA_SYSTEM, MEDIA_PARAMS, MEDIA_MESSAGES, MEDIA_LICENSE)

_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")  # fullmatch: no trailing newline
CHUNK = 1 << 20
STATE_DIR = ".jupyter-llm"  # the lock and the holds; Ollama ignores it
# text and JSON layers (and the config) are read whole by every get(): a larger
# one is refused unread (and a pull refuses it before downloading)
MAX_TEXT_LAYER = TEXT_LAYER.value
UPLOAD_HOLD = 3600.0  # seconds an uploaded blob waits for its /api/create
MAX_UPLOAD_HOLDS = 1024  # uploads held at once (each rewrite of the hold is this long)


def parse_digest(digest: object, field: str = "digest") -> str:
    """Normalise ``sha256:<hex>`` (or ``sha256-<hex>``) to ``sha256:<hex>``."""
    if not isinstance(digest, str) or not (m := _DIGEST.fullmatch(digest)):
        raise InvalidRequest(f"invalid {field}: {digest!r}; expected sha256:<64 hex digits>")
    return f"sha256:{m.group(1)}"


def _model_name_or_empty(text: object) -> str:
    """A layer's ``from`` (a pulled manifest's, perhaps hostile): shown only
    as a valid model name."""
    try:
        return parse_model_name(text).display if text else ""
    except InvalidRequest:
        return ""


@dataclass(frozen=True)
class ModelEntry:
    """A model as the store knows it (no runner state)."""

    name: ModelName
    digest: str  # sha256 of the manifest, as Ollama reports it
    size: int
    modified_at: datetime
    model_path: Path
    template: str | None
    system: str | None
    config: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)  # Ollama options
    messages: list[dict[str, Any]] = field(default_factory=list)
    license: str | None = None
    projector_path: Path | None = None  # the projector layer's blob: the model sees images
    draft_path: Path | None = None  # the draft layer's blob: a draft model for speculation
    draft_from: str = ""  # the model the draft was named by at create ("": a file)

    @property
    def vision(self) -> bool:
        return self.projector_path is not None

    @property
    def details(self) -> dict[str, Any]:
        c = self.config
        family = c.get("model_family", "")
        families = c.get("model_families")
        if not (
            isinstance(families, list) and families and all(isinstance(f, str) for f in families)
        ):
            families = [family] if family else None
        return {
            "parent_model": "",
            "format": c.get("model_format", "gguf"),
            "family": family,
            "families": families,
            "parameter_size": c.get("model_type", ""),
            "quantization_level": c.get("file_type", ""),
        }


# an upload's temporary file untouched this long at startup is a dead server's
# (a body being received writes as its bytes come)
STALE_UPLOAD_SECONDS = 3600


class BlobWriter:
    """Receives a blob in chunks, hashing as it goes; ``commit`` keeps it only if
    the sha256 matches. Used for streamed HTTP uploads."""

    def __init__(self, store: ModelStore) -> None:
        store.blobs_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".upload-", dir=store.blobs_dir)
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self._tmp = Path(name)
        self._hash = hashlib.sha256()
        self._store = store
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._hash.update(chunk)
        self.size += len(chunk)

    def commit(self, expected: str) -> str:
        expected = parse_digest(expected)
        actual = f"sha256:{self._hash.hexdigest()}"
        try:
            self._file.close()
            if actual != expected:
                raise InvalidRequest(f"digest mismatch, expected {expected!r}, got {actual!r}")
            os.replace(self._tmp, self._store.blob_path(expected))
        finally:
            self._tmp.unlink(missing_ok=True)
        return actual

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)


class ModelStore:
    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        """``clock``: wall time in seconds (holds of other processes compare
        with it); tests pass their own."""
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir = self.root / "manifests"
        self.lock = store_lock(self.root / STATE_DIR / "lock")
        self._holds = BlobHolds(self.root / STATE_DIR / "holds", self.lock, clock)
        self._uploads: Hold | None = None  # this store's uploads awaiting their create
        self._params: dict[str, dict[str, Any]] = {}  # params blob -> checked, warned once

    # -- blobs ---------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.blobs_dir / parse_digest(digest).replace(":", "-")

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def blob_writer(self) -> BlobWriter:
        return BlobWriter(self)

    def remove_stale_uploads(self, older_than: float = STALE_UPLOAD_SECONDS) -> int:
        """Delete the uploads a server that died mid-body left (``.upload-*``
        untouched for ``older_than`` seconds: one still written to is newer,
        whichever server on this store writes it). Returns how many."""
        removed = 0
        now = time.time()
        for path in self.blobs_dir.glob(".upload-*") if self.blobs_dir.is_dir() else ():
            try:
                if now - path.stat().st_mtime > older_than:
                    path.unlink()
                    removed += 1
            except OSError:  # gone meanwhile, or not ours to delete
                continue
        return removed

    def hold(self, digests: Iterable[str] = ()) -> Hold:
        """Keep these blobs from collection until the hold is released: a pull
        holds what it reuses and downloads until its manifest is written."""
        return self._holds.hold(parse_digest(d) for d in digests)

    def commit_upload(self, writer: BlobWriter, digest: str) -> str:
        """Keep an uploaded blob (``POST /api/blobs``) and hold it for its
        create, in one step under the lock: no collection falls between."""
        with self.lock:
            digest = writer.commit(digest)
            self.hold_upload(digest)
        return digest

    def hold_upload(self, digest: str) -> None:
        """Hold ``digest`` until a create uses it, ``UPLOAD_HOLD`` seconds at most."""
        digest = parse_digest(digest)
        with self.lock:
            if self._uploads is None or self._uploads.released:
                self._uploads = self._holds.hold()
            uploads = self._uploads
            uploads.remove((), expired=True)
            if digest not in uploads.until and len(uploads.until) >= MAX_UPLOAD_HOLDS:
                uploads.remove([min(uploads.until, key=uploads.until.__getitem__)])
            uploads.add(digest, until=self._holds.clock() + UPLOAD_HOLD)

    def _uploads_used(self, digests: Iterable[str]) -> None:
        """A create used these uploads: they need no hold now (under the lock)."""
        uploads = self._uploads
        if uploads is None or uploads.released:
            return
        uploads.remove(digests, expired=True)
        if not uploads.until:
            uploads.release()
            self._uploads = None

    def adopt_blob(self, partial: Path, digest: str, holds: Iterable[Hold] = ()) -> None:
        """Move a verified download into place and into ``holds`` in one step
        under the lock, so no collection can fall between the two."""
        with self.lock:
            os.replace(partial, self.blob_path(digest))
            for hold in holds:
                hold.add(parse_digest(digest))

    def add_blob_from_file(self, path: Path) -> str:
        """Copy a local file into the store; returns its digest."""
        writer = self.blob_writer()
        try:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    writer.write(chunk)
                    digest.update(chunk)
        except BaseException:
            writer.abort()
            raise
        return writer.commit(f"sha256:{digest.hexdigest()}")

    def add_blob_bytes(self, data: bytes) -> str:
        writer = self.blob_writer()
        writer.write(data)
        return writer.commit(f"sha256:{hashlib.sha256(data).hexdigest()}")

    # -- manifests -----------------------------------------------------------------
    def manifest_path(self, name: ModelName) -> Path:
        return self.manifests_dir.joinpath(*name.manifest_parts())

    def existing_name(self, name: ModelName) -> ModelName:
        """``name`` with each part spelled as the store has it, read in any
        case as Ollama's ``getExistingName`` reads names (``TINY`` is
        ``tiny:latest``; ``TINY:v2`` beside it is ``tiny:v2``); a part the
        store lacks stays as written. The spelling comes from the folders'
        listings, so a case-insensitive file system gives it too."""
        folder, parts = self.manifests_dir, []
        for part in name.manifest_parts():
            try:
                names = os.listdir(folder)
            except OSError:
                names = []
            if part not in names:
                part = next((n for n in sorted(names) if n.casefold() == part.casefold()), part)
            parts.append(part)
            folder = folder / part
        return ModelName(*parts, name.written)

    def create(
        self,
        model: str | ModelName,
        files: dict[str, str] | None = None,
        template: str | None = None,
        system: str | None = None,
        *,
        from_model: str | ModelName | None = None,
        parameters: dict[str, Any] | None = None,
        messages: list[dict[str, Any]] | None = None,
        license: str | list[str] | None = None,
        draft: str | ModelName | None = None,
    ) -> ModelEntry:
        """Make a model from uploaded GGUF blobs (``files``: the model, and at most
        one projector, told apart by their headers as Ollama does) or an existing
        model (``from_model``, whose projector and draft it keeps), with optional
        template, system prompt, parameters, messages and license layers replacing
        the base's. ``draft``: a draft model (an uploaded blob's digest, or a
        model whose GGUF it shares), checked against the model's vocabulary."""
        name = model if isinstance(model, ModelName) else parse_model_name(model)
        if files and from_model:
            raise InvalidRequest("give either files or from, not both")
        if not files and not from_model:
            raise InvalidRequest("files or from is required: upload a GGUF with /api/blobs first")
        ggufs = None if from_model else self._ggufs(files)
        target = self.get(from_model).model_path if from_model else None
        if ggufs:
            target = self.blob_path(ggufs[0][2])
        assert target is not None
        base = parse_model_name(from_model) if isinstance(from_model, str) else from_model
        drafted = None if draft is None else self._draft(draft, target, base or name)
        texts = {
            MEDIA_TEMPLATE: template,
            MEDIA_SYSTEM: system,
            MEDIA_PARAMS: json.dumps(parameters) if parameters else None,
            MEDIA_MESSAGES: json.dumps(messages) if messages else None,
        }
        licenses = [license] if isinstance(license, str) else list(license or [])
        for media, text in [*texts.items(), *((MEDIA_LICENSE, t) for t in licenses)]:
            if text and len(text) > MAX_TEXT_LAYER // 4:  # else within it however encoded
                self._check_text_layer(media, str(text))
        with self.lock:  # from the base's layers until the manifest is written
            if from_model:
                layers, kept, config = self._base_layers(from_model)
            else:
                assert ggufs is not None
                # again: a blob may have gone meanwhile
                layers = [self._layer(media, self._uploaded(f, d)) for media, f, d, _ in ggufs]
                kept = {}
                config = self._config_for(*(info for _, _, _, info in ggufs))
            if drafted is not None:  # it replaces the base's
                layers = [la for la in layers if la["mediaType"] != MEDIA_DRAFT]
                layers.append(self._layer(MEDIA_DRAFT, self._uploaded("draft", drafted[0])))
                if drafted[1]:
                    layers[-1]["from"] = drafted[1]
            layers += self._text_layers(texts, licenses, kept)
            self._write_manifest(name, config, layers)
            if ggufs:
                self._uploads_used(d for _, _, d, _ in ggufs)
            if drafted is not None and not drafted[1]:
                self._uploads_used([drafted[0]])
            return self.get(name)

    @staticmethod
    def _check_text_layer(media: str, text: str) -> None:
        """Refuse, before anything is written, a text ``get`` could not read back."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_TEXT_LAYER:
            kind = media.rsplit(".", 1)[-1]
            raise InvalidRequest(f"{kind} is too large ({size} bytes, at most {MAX_TEXT_LAYER})")

    def _text_layers(
        self, texts: dict[str, str | None], licenses: list[Any], kept: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The template, system, parameters, messages and license layers: the
        ones given, else the base model's."""
        layers = []
        for media in REPLACEABLE:
            if media == MEDIA_LICENSE:
                continue
            if text := texts.get(media):
                layers.append(self._layer(media, self.add_blob_bytes(text.encode())))
            elif media in kept:
                layers.append(kept[media])
        for text in licenses:
            layers.append(self._layer(MEDIA_LICENSE, self.add_blob_bytes(str(text).encode())))
        if not licenses and MEDIA_LICENSE in kept:
            layers.append(kept[MEDIA_LICENSE])
        return layers

    def _write_manifest(
        self, name: ModelName, config: dict[str, Any], layers: list[dict[str, Any]]
    ) -> None:
        config_bytes = json.dumps(config).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {
                "mediaType": MEDIA_CONFIG,
                "digest": self.add_blob_bytes(config_bytes),
                "size": len(config_bytes),
            },
            "layers": layers,
        }
        self._replace_manifest(name, json.dumps(manifest, indent=2).encode())

    def _ggufs(self, files: object) -> list[tuple[str, str, str, GGUFInfo]]:
        """(media type, file name, digest, header) of each uploaded GGUF that
        ``files`` names: exactly one model, and at most one projector (a GGUF
        whose ``general.architecture`` is ``clip``), the model first."""
        if not isinstance(files, dict) or not files:
            raise InvalidRequest("files must be an object mapping file names to digests")
        if len(files) > 2:  # refused before any header is read
            raise InvalidRequest(
                f"files names {len(files)} files: one GGUF model file and at most one projector"
            )
        found = []
        for fname, raw in files.items():
            digest = self._uploaded(fname, parse_digest(raw, f"files[{fname!r}]"))
            info = read_gguf_info(self.blob_path(digest))
            found.append(
                (MEDIA_PROJECTOR if info.is_projector else MEDIA_MODEL, fname, digest, info)
            )
        models = [g for g in found if g[0] == MEDIA_MODEL]
        projectors = [g for g in found if g[0] == MEDIA_PROJECTOR]
        if len(projectors) > 1:
            names = ", ".join(repr(f) for _, f, _, _ in projectors)
            raise InvalidRequest(f"files name more than one projector: {names}")
        if len(models) != 1:
            raise InvalidRequest(
                "files must name exactly one GGUF model file"
                + (f" (and at most one projector), not {len(models)}" if models else "")
            )
        return models + projectors

    def _draft(self, draft: str | ModelName, target: Path, name: ModelName) -> tuple[str, str]:
        """(blob digest, the model it was named by or "") of a draft: an
        uploaded GGUF or a model's own, a language model that shares the
        target's vocabulary. Reads two headers: blocking."""
        if isinstance(draft, ModelName):
            entry = self.get(draft)
            digest, shown = "sha256:" + entry.model_path.name[7:], draft.display
        else:
            digest, shown = self._uploaded("draft", parse_digest(draft, "draft")), ""
        if read_gguf_info(self.blob_path(digest)).is_projector:
            raise InvalidRequest(f"draft {shown or digest} is a projector, not a language model")
        check_vocabulary(target, self.blob_path(digest), shown or digest, name.display)
        return digest, shown

    def _uploaded(self, fname: str, digest: str) -> str:
        if not self.has_blob(digest):
            raise InvalidRequest(f"blob {digest} for {fname!r} has not been uploaded")
        return digest

    def _base_layers(
        self, from_model: str | ModelName
    ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
        """A base model's fixed layers, its replaceable ones by media type, its config."""
        base = self.get(from_model)
        base_manifest = json.loads(self.manifest_path(base.name).read_bytes())
        layers = [la for la in base_manifest["layers"] if la["mediaType"] not in REPLACEABLE]
        kept = {
            la["mediaType"]: la for la in base_manifest["layers"] if la["mediaType"] in REPLACEABLE
        }
        return layers, kept, base.config

    def get(self, model: str | ModelName) -> ModelEntry:
        name = model if isinstance(model, ModelName) else parse_model_name(model)
        name = self.existing_name(name)
        path = self.manifest_path(name)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ModelNotFound(name.display) from None
        return self._entry(name, path, raw)

    def list(self) -> list[ModelEntry]:
        entries = []
        if not self.manifests_dir.is_dir():
            return entries
        for path in self.manifests_dir.glob("*/*/*/*"):
            if not path.is_file() or path.name.startswith("."):
                continue
            host, namespace, name, tag = path.relative_to(self.manifests_dir).parts
            try:
                model = ModelName(host, namespace, name, tag)
                entries.append(self._entry(model, path, path.read_bytes()))
            except (ValueError, KeyError, OSError, InvalidRequest):
                continue  # a foreign or broken manifest is skipped, not fatal
        return sorted(entries, key=lambda e: e.modified_at, reverse=True)

    def write_manifest(self, model: ModelName, raw: bytes) -> ModelEntry:
        """Record a pulled manifest, once all its blobs are in place."""
        with self.lock:
            for digest in self._references(raw):
                if not self.has_blob(digest):
                    raise InvalidRequest(f"blob {digest} is missing: the pull is incomplete")
            self._replace_manifest(model, raw)
            return self.get(model)

    def copy(self, source: str | ModelName, destination: str | ModelName) -> ModelEntry:
        """A second name for the same blobs (only the manifest is written)."""
        src = source if isinstance(source, ModelName) else parse_model_name(source, "source")
        dst = (
            destination
            if isinstance(destination, ModelName)
            else parse_model_name(destination, "destination")
        )
        with self.lock:
            try:
                raw = self.manifest_path(self.existing_name(src)).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise ModelNotFound(src.display) from None
            self._replace_manifest(dst, raw)
            return self.get(dst)

    def delete(self, model: str | ModelName) -> list[str]:
        """Remove the manifest, then the blobs nothing else references (no other
        manifest, no pull's hold). Returns the digests of the blobs removed."""
        name = model if isinstance(model, ModelName) else parse_model_name(model)
        with self.lock:
            path = self.manifest_path(self.existing_name(name))
            try:
                raw = path.read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise ModelNotFound(name.display) from None
            own = self._references_or_none(path, raw) or set()
            path.unlink()
            for parent in path.parents:  # tidy empty name/namespace/host folders
                if parent == self.manifests_dir or any(parent.iterdir()):
                    break
                parent.rmdir()
            return self._collect(own)

    # -- collection (under the lock) --------------------------------------------------
    def _replace_manifest(self, name: ModelName, raw: bytes) -> None:
        """Write a manifest (over a stored name that differs only in case, as
        Ollama's names are one model in any case); the blobs only the one it
        replaces used are freed."""
        path = self.manifest_path(self.existing_name(name))
        try:
            old = self._references_or_none(path, path.read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            old = None
        self._write_atomic(path, raw)
        if old:
            self._collect(old)

    def _collect(self, candidates: set[str]) -> list[str]:
        """Delete the candidates no manifest and no hold references. Deletes
        nothing when a manifest or hold cannot be read: its references are unknown."""
        if not candidates:
            return []
        used: set[str] = set()
        unreadable: list[str] = []
        if self.manifests_dir.is_dir():
            for path in self.manifests_dir.glob("*/*/*/*"):
                if path.name.startswith(".") or not path.is_file():
                    continue  # a temporary file of a write, or not a manifest
                try:
                    used |= self._references(path.read_bytes())
                except FileNotFoundError:
                    continue
                except (OSError, ValueError) as e:
                    unreadable.append(f"{path} ({e})")
        try:
            used |= self._holds.held()
        except HoldUnreadable as e:
            unreadable.append(str(e))
        if unreadable:
            log.warning(
                "no blobs freed: cannot tell which blobs these use: %s", "; ".join(unreadable)
            )
            return []
        removed = []
        for digest in sorted(candidates - used):
            try:
                self.blob_path(digest).unlink()
                removed.append(digest)
            except FileNotFoundError:
                pass
        return removed

    def _references_or_none(self, path: Path, raw: bytes) -> set[str] | None:
        try:
            return self._references(raw)
        except ValueError as e:
            log.warning("%s cannot be read (%s): the blobs it uses are left in place", path, e)
            return None

    @staticmethod
    def _references(raw: bytes) -> set[str]:
        """Every digest a manifest names; ``ValueError`` unless it is clearly one."""
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
            raise ValueError("not a manifest: no list of layers")
        config = manifest.get("config")
        refs = set()
        for layer in [*manifest["layers"], *([config] if config is not None else [])]:
            if not isinstance(layer, dict):
                raise ValueError("a layer is not an object")
            try:
                refs.add(parse_digest(layer.get("digest")))
            except InvalidRequest as e:
                raise ValueError(str(e)) from None
        return refs

    # -- helpers -------------------------------------------------------------------
    def _entry(self, name: ModelName, path: Path, raw: bytes) -> ModelEntry:
        manifest = json.loads(raw)
        layers = manifest.get("layers", [])
        model_layer = next((la for la in layers if la.get("mediaType") == MEDIA_MODEL), None)
        if model_layer is None:
            raise InvalidRequest(f"model '{name.display}' has no model layer")

        def layer(media: str) -> dict[str, Any] | None:
            return next((la for la in layers if la.get("mediaType") == media), None)

        def text(media: str) -> str | None:
            found = layer(media)
            return (
                self._small_blob(found["digest"], name).decode(errors="replace") if found else None
            )

        def parsed(media: str, default: Any) -> Any:
            try:
                raw_text = text(media)
                return json.loads(raw_text) if raw_text else default
            except (OSError, ValueError):
                return default

        messages = parsed(MEDIA_MESSAGES, [])
        params: dict[str, Any] = {}
        if found := layer(MEDIA_PARAMS):
            key = str(found.get("digest"))
            if key not in self._params:  # blobs never change: check (and warn) once
                # a manifest's parameters pass the checks a request's options do
                self._params[key] = model_params(parsed(MEDIA_PARAMS, {}), name.display)
            params = copy.deepcopy(self._params[key])
        config: dict[str, Any] = {}
        if cfg := manifest.get("config"):
            try:
                config = json.loads(self._small_blob(cfg["digest"], name))
            except (OSError, ValueError):
                config = {}
        return ModelEntry(
            name=name,
            digest=hashlib.sha256(raw).hexdigest(),
            size=sum(int(la.get("size", 0)) for la in layers),
            modified_at=datetime.fromtimestamp(path.stat().st_mtime, UTC),
            model_path=self.blob_path(model_layer["digest"]),
            template=text(MEDIA_TEMPLATE),
            system=text(MEDIA_SYSTEM),
            config=config,
            params=params,
            messages=messages if isinstance(messages, list) else [],
            license=text(MEDIA_LICENSE),
            projector_path=self.blob_path(found["digest"])
            if (found := layer(MEDIA_PROJECTOR))
            else None,
            draft_path=self.blob_path(drafted["digest"])
            if (drafted := layer(MEDIA_DRAFT))
            else None,
            draft_from=_model_name_or_empty(drafted.get("from")) if drafted else "",
        )

    def _small_blob(self, digest: str, name: ModelName) -> bytes:
        """A text or JSON layer's bytes; ``InvalidRequest`` if too large to be one."""
        path = self.blob_path(digest)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_TEXT_LAYER:
                raise InvalidRequest(
                    f"model '{name.display}': layer {digest} is too large "
                    f"({size} bytes, at most {MAX_TEXT_LAYER} for text)"
                )
            return f.read()

    def _layer(self, media: str, digest: str) -> dict[str, Any]:
        return {"mediaType": media, "digest": digest, "size": self.blob_path(digest).stat().st_size}

    @staticmethod
    def _config_for(info: GGUFInfo, *projectors: GGUFInfo) -> dict[str, Any]:
        """The config blob; a projector's architecture joins the families
        ("llama", "clip"), as in Ollama's vision models."""
        families = [info.architecture]
        families += [p.architecture for p in projectors if p.architecture not in families]
        return {
            "model_format": "gguf",
            "model_family": info.architecture,
            "model_families": families,
            "model_type": info.parameter_size,
            "file_type": info.file_type,
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
        }

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
