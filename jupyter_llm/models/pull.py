"""Pulling models: Ollama registries, Hugging Face GGUF repos, direct GGUF URLs.

Every blob downloads to ``blobs/sha256-<hex>-partial`` (or a URL-keyed partial
when the digest is not known up front), resumes with HTTP Range after an
interruption, and becomes a blob only once its sha256 matches. The manifest is
written last, so a killed server never leaves a model listed that cannot load.
Until then the pull holds every blob it reuses or fetches (``ModelStore.hold``),
so a concurrent delete of another model cannot free them. Concurrent pulls of
one blob share one download. Proxies come from the usual
environment variables (httpx's ``trust_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from jupyter_llm.errors import InsufficientStorage, InvalidRequest, PullFailed
from jupyter_llm.models.holds import Hold
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.models.store import (
    MEDIA_CONFIG,
    MEDIA_MANIFEST,
    MEDIA_MODEL,
    ModelStore,
    parse_digest,
)

CHUNK = 1 << 20
DEFAULT_QUANT = "Q4_K_M"
HF_HOSTS = ("hf.co", "huggingface.co")
MANIFEST_ACCEPT = f"{MEDIA_MANIFEST}, application/vnd.oci.image.manifest.v1+json"
MAX_MANIFEST = 4 << 20

Progress = dict[str, Any]


@dataclass
class Download:
    """One blob being fetched; shared by every pull that needs it."""

    digest: str | None
    total: int
    completed: int = 0
    task: asyncio.Task[str] | None = None
    holds: list[Hold] = field(default_factory=list)  # of the pulls waiting on it


class Puller:
    """Owns the HTTP client and the table of downloads in progress."""

    def __init__(self, store: ModelStore, hf_endpoint: str | None = None) -> None:
        self.store = store
        self.hf_endpoint = (
            hf_endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        ).rstrip("/")
        self._downloads: dict[str, Download] = {}

    # -- entry point ---------------------------------------------------------------
    async def pull(
        self, source: str, *, insecure: bool = False, name: str | None = None
    ) -> AsyncIterator[Progress]:
        """Progress dicts as Ollama streams them, ending with ``{"status": "success"}``."""
        if not isinstance(source, str) or not source.strip():
            raise InvalidRequest("model is required and must be a non-empty string")
        source = source.strip()
        async with httpx.AsyncClient(
            follow_redirects=True, timeout=httpx.Timeout(30.0, read=300.0), trust_env=True
        ) as client:
            if re.match(r"^https?://", source, re.I):
                gen = self._pull_url(client, source, name, insecure)
            else:
                model = parse_model_name(source)
                if model.host in HF_HOSTS:
                    gen = self._pull_hf(client, model)
                else:
                    gen = self._pull_registry(client, model, insecure)
            async for event in gen:
                yield event

    # -- Ollama registry -----------------------------------------------------------
    async def _pull_registry(
        self, client: httpx.AsyncClient, model: ModelName, insecure: bool
    ) -> AsyncIterator[Progress]:
        scheme = "http" if insecure else "https"
        base = f"{scheme}://{model.host}/v2/{model.namespace}/{model.name}"
        yield {"status": "pulling manifest"}
        response = await self._get(
            client, f"{base}/manifests/{model.tag}", headers={"Accept": MANIFEST_ACCEPT}
        )
        if response.status_code == 404:
            raise PullFailed(f"pull model manifest: file does not exist: {model.display}", 404)
        raw = response.content
        if len(raw) > MAX_MANIFEST:
            raise PullFailed("pull model manifest: the manifest is too large")
        layers, config = validate_manifest(raw)
        async with self._hold([la["digest"] for la in [*layers, config]]) as hold:
            await self._check_disk(
                [la["size"] for la in [*layers, config] if not self.store.has_blob(la["digest"])]
            )
            for layer in [*layers, config]:
                digest, size = layer["digest"], layer["size"]
                url = f"{base}/blobs/{digest}"
                async for event in self._fetch_blob(client, url, digest, size, hold):
                    yield event
            yield {"status": "verifying sha256 digest"}
            yield {"status": "writing manifest"}
            await asyncio.get_running_loop().run_in_executor(
                None, self.store.write_manifest, model, raw
            )
        yield {"status": "success"}

    # -- Hugging Face --------------------------------------------------------------
    async def _pull_hf(
        self, client: httpx.AsyncClient, model: ModelName
    ) -> AsyncIterator[Progress]:
        repo = f"{model.namespace}/{model.name}"
        quant = DEFAULT_QUANT if model.tag == "latest" else model.tag
        yield {"status": "pulling manifest"}
        response = await self._get(
            client, f"{self.hf_endpoint}/api/models/{repo}", params={"blobs": "true"}
        )
        if response.status_code in (401, 404):
            raise PullFailed(f"pull model manifest: no such Hugging Face repo: {repo}", 404)
        try:
            siblings = response.json().get("siblings", [])
        except ValueError:
            raise PullFailed("pull model manifest: Hugging Face sent invalid JSON") from None
        file, digest, size = pick_gguf(siblings, quant)
        async with self._hold([digest] if digest else []) as hold:
            await self._check_disk([size] if not (digest and self.store.has_blob(digest)) else [])
            url = f"{self.hf_endpoint}/{repo}/resolve/main/{file}"
            async for event in self._fetch_blob(client, url, digest, size, hold):
                if event.get("digest"):
                    digest = event["digest"]
                yield event
            named = ModelName("hf.co", model.namespace, model.name, quant)
            async for event in self._finish_gguf(named, digest, file):
                yield event

    # -- direct URL ----------------------------------------------------------------
    async def _pull_url(
        self, client: httpx.AsyncClient, url: str, name: str | None, insecure: bool
    ) -> AsyncIterator[Progress]:
        parsed = urlparse(url)
        if parsed.scheme.lower() == "http" and not insecure and not _is_loopback(parsed.hostname):
            raise InvalidRequest('plain http pulls need "insecure": true')
        file = Path(parsed.path).name
        if not file.lower().endswith(".gguf"):
            raise InvalidRequest("a URL pull must name a .gguf file")
        model = parse_model_name(name or url_model_name(file), "name")
        yield {"status": "pulling manifest"}
        head = await self._get(client, url, method="HEAD")
        size = int(head.headers.get("content-length") or 0)
        await self._check_disk([size])
        digest = None
        async with self._hold([]) as hold:
            async for event in self._fetch_blob(client, url, None, size, hold):
                digest = event.get("digest") or digest
                yield event
            async for event in self._finish_gguf(model, digest, file):
                yield event

    async def _finish_gguf(
        self, model: ModelName, digest: str | None, file: str
    ) -> AsyncIterator[Progress]:
        if digest is None:
            raise PullFailed("the download produced no file")
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.store.create(model, {file: digest})
        )
        yield {"status": "success"}

    # -- blobs ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _hold(self, digests: list[str]) -> AsyncIterator[Hold]:
        """Keep these blobs (and those the pull adds) until its manifest is written."""
        loop = asyncio.get_running_loop()
        hold = await loop.run_in_executor(None, self.store.hold, digests)
        try:
            yield hold
        finally:
            await loop.run_in_executor(None, hold.release)

    async def _fetch_blob(
        self, client: httpx.AsyncClient, url: str, digest: str | None, size: int, hold: Hold
    ) -> AsyncIterator[Progress]:
        """Download (or join the download of) one blob, reporting progress. The
        blob joins ``hold`` in the same step that moves it into the store."""
        if digest is not None and self.store.has_blob(digest):
            yield {
                "status": f"pulling {digest[7:19]}",
                "digest": digest,
                "total": size,
                "completed": size,
            }
            return
        key = digest or f"url:{url}"
        download = self._downloads.get(key)
        if download is None or download.task is None or download.task.done():
            download = Download(digest=digest, total=size)
            download.task = asyncio.ensure_future(self._download(client, url, download))
            self._downloads[key] = download
        download.holds.append(hold)
        label = digest[7:19] if digest else Path(urlparse(url).path).name[:24]
        try:
            while not download.task.done():
                yield {
                    "status": f"pulling {label}",
                    "digest": digest or "",
                    "total": download.total,
                    "completed": download.completed,
                }
                await asyncio.wait({download.task}, timeout=0.5)
            final = download.task.result()
            await asyncio.get_running_loop().run_in_executor(None, self._keep, hold, final)
        finally:
            if download.task.done() and self._downloads.get(key) is download:
                del self._downloads[key]
        yield {
            "status": f"pulling {label}",
            "digest": final,
            "total": download.total,
            "completed": download.total,
        }

    async def _download(self, client: httpx.AsyncClient, url: str, d: Download) -> str:
        """Fetch to a partial file (resuming it), verify, move into the store."""
        loop = asyncio.get_running_loop()
        self.store.blobs_dir.mkdir(parents=True, exist_ok=True)
        partial = self.store.blobs_dir / (
            f"{d.digest.replace(':', '-')}-partial"
            if d.digest
            else f"url-{hashlib.sha256(url.encode()).hexdigest()[:32]}-partial"
        )
        hasher = hashlib.sha256()
        have = await loop.run_in_executor(None, _hash_existing, partial, hasher)
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            async with client.stream("GET", url, headers=headers) as response:
                if response.status_code == 416 and have:  # already complete
                    pass
                elif response.status_code not in (200, 206):
                    raise PullFailed(f"download {url}: HTTP {response.status_code}")
                else:
                    if response.status_code == 200 and have:  # the server ignored Range
                        have, hasher = 0, hashlib.sha256()
                        await loop.run_in_executor(None, partial.write_bytes, b"")
                    length = int(response.headers.get("content-length") or 0)
                    d.total = max(d.total, have + length)
                    d.completed = have
                    with open(partial, "ab") as out:
                        pending: list[bytes] = []  # written in ~1 MiB steps, off the loop
                        try:
                            async for chunk in response.aiter_bytes():
                                pending.append(chunk)
                                d.completed += len(chunk)
                                if sum(map(len, pending)) >= CHUNK:
                                    data, pending = b"".join(pending), []
                                    await loop.run_in_executor(
                                        None, _write_and_hash, out, hasher, data
                                    )
                        finally:  # keep what arrived, so that a retry resumes after it
                            if pending:
                                await loop.run_in_executor(
                                    None, _write_and_hash, out, hasher, b"".join(pending)
                                )
        except httpx.HTTPError as e:
            raise PullFailed(
                f"download interrupted ({type(e).__name__}): pull again to resume where it stopped"
            ) from e
        actual = f"sha256:{hasher.hexdigest()}"
        if d.digest is not None and actual != d.digest:
            partial.unlink(missing_ok=True)
            raise PullFailed(
                f"digest mismatch, file must be downloaded again: want {d.digest}, got {actual}"
            )
        await loop.run_in_executor(None, self.store.adopt_blob, partial, actual, list(d.holds))
        d.total = d.completed = max(d.completed, d.total)
        return actual

    def _keep(self, hold: Hold, digest: str) -> None:
        """Make sure a shared download's blob is in this pull's hold (a pull that
        joined after the blob was moved into place adds it here)."""
        with self.store.lock:
            if not self.store.has_blob(digest):
                raise PullFailed(f"blob {digest} was deleted during the pull: pull again")
            hold.add(digest)

    async def _get(
        self, client: httpx.AsyncClient, url: str, method: str = "GET", **kwargs: Any
    ) -> httpx.Response:
        try:
            response = await client.request(method, url, **kwargs)
            if response.status_code == 401 and (token := await _bearer_token(client, response)):
                headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {token}"}
                response = await client.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as e:
            raise PullFailed(f"pull {url}: {type(e).__name__}: {e}") from e
        if response.status_code >= 400 and response.status_code not in (401, 404):
            raise PullFailed(f"pull {url}: HTTP {response.status_code}")
        return response

    async def _check_disk(self, sizes: list[int]) -> None:
        need = sum(sizes)
        free = await asyncio.get_running_loop().run_in_executor(
            None, lambda: shutil.disk_usage(self.store.root).free
        )
        if need > free:
            raise InsufficientStorage(
                f"not enough disk space: the pull needs {_gib(need)}, {_gib(free)} is free "
                f"in {self.store.root}"
            )


def validate_manifest(raw: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Layers and config of a registry manifest; every digest checked so that no
    manifest can name a path outside the store."""
    try:
        manifest = json.loads(raw)
        layers, config = manifest["layers"], manifest["config"]
        checked = []
        for layer in [*layers, config]:
            checked.append(
                {
                    "mediaType": str(layer.get("mediaType", "")),
                    "digest": parse_digest(layer["digest"], "manifest digest"),
                    "size": int(layer["size"]),
                }
            )
    except InvalidRequest as e:
        raise PullFailed(f"pull model manifest: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise PullFailed("pull model manifest: not a valid manifest") from None
    if not any(la["mediaType"] == MEDIA_MODEL for la in checked[:-1]):
        raise PullFailed("pull model manifest: no model layer")
    if any(la["size"] < 0 for la in checked):
        raise PullFailed("pull model manifest: negative layer size")
    return checked[:-1], checked[-1] | {"mediaType": checked[-1]["mediaType"] or MEDIA_CONFIG}


def pick_gguf(siblings: list[dict[str, Any]], quant: str) -> tuple[str, str | None, int]:
    """The repo's GGUF file for ``quant`` (case-insensitive), its sha256 and size."""
    ggufs = [s for s in siblings if str(s.get("rfilename", "")).lower().endswith(".gguf")]
    if not ggufs:
        raise PullFailed("pull model manifest: the repo has no GGUF files", 404)
    wanted = quant.lower()
    matches = [
        s
        for s in ggufs
        if wanted in Path(s["rfilename"]).name.lower() and "mmproj" not in s["rfilename"].lower()
    ]
    if not matches:
        quants = sorted({q for s in ggufs if (q := _quant_of(s["rfilename"]))})
        raise PullFailed(
            f"no GGUF for quantization {quant!r}; available: "
            f"{', '.join(quants) or 'none recognised'}",
            404,
        )
    choice = sorted(matches, key=lambda s: len(s["rfilename"]))[0]
    lfs = choice.get("lfs") or {}
    digest = (
        f"sha256:{lfs['sha256']}" if re.fullmatch(r"[0-9a-f]{64}", str(lfs.get("sha256"))) else None
    )
    return choice["rfilename"], digest, int(lfs.get("size") or choice.get("size") or 0)


def url_model_name(file: str) -> str:
    stem = re.sub(r"[^a-z0-9_.-]+", "-", Path(file).stem.lower()).strip("-.") or "model"
    return f"{stem[:80]}:latest"


def _quant_of(filename: str) -> str | None:
    m = re.search(r"((?:I?Q\d[\w]*?)|F16|F32|BF16)(?:\.gguf$|-)", filename, re.I)
    return m.group(1).upper() if m else None


def _is_loopback(host: str | None) -> bool:
    return host in ("localhost", "127.0.0.1", "::1") or bool(host and host.startswith("127."))


def _hash_existing(partial: Path, hasher: Any) -> int:
    if not partial.exists():
        return 0
    size = 0
    with open(partial, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return size


def _write_and_hash(out: Any, hasher: Any, chunk: bytes) -> None:
    out.write(chunk)
    hasher.update(chunk)


async def _bearer_token(client: httpx.AsyncClient, response: httpx.Response) -> str | None:
    """Docker-registry token auth: follow WWW-Authenticate's realm for a token."""
    challenge = response.headers.get("www-authenticate", "")
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    try:
        reply = await client.get(realm, params=params)
        return reply.json().get("token") or reply.json().get("access_token")
    except (httpx.HTTPError, ValueError):
        return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
