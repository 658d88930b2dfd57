"""Pulling models: Ollama registries, Hugging Face GGUF repos, direct GGUF URLs.

Every blob downloads to ``blobs/sha256-<hex>-partial`` (or a URL-keyed partial
when the digest is not known up front), resumes with HTTP Range after an
interruption only when the server proves it is the same file, never past its
declared size, and becomes a blob only once its sha256 matches (``download``).
An interrupted download is tried again by itself (``Puller.retry``), each
retry announced as a status line while the blob's progress keeps its place.
Manifests and API answers are read with a size cap (``fetch``). The manifest is
written last, so a killed server never leaves a model listed that cannot load.
Until then the pull holds every blob it reuses or fetches (``ModelStore.hold``),
so a concurrent delete of another model cannot free them. Concurrent pulls of
one blob share one download, which outlives a pull that leaves while others
follow it; when the last one leaves (its client disconnected), the download is
cancelled and its partial kept. Proxies come from the usual environment
variables (httpx's ``trust_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from jupyter_llm.models import download as _download
from jupyter_llm.models.download import DEFAULT_RETRY, Download, RetryNote, RetryPolicy
from jupyter_llm.models.fetch import MAX_HF_API, MAX_MANIFEST, MAX_TOKEN, Answer, read_capped
from jupyter_llm.models.holds import Hold
from jupyter_llm.models.hosts import (
    check_realm,
    is_loopback,
    trusted_auth_hosts,
)
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.models.store import (
    MAX_TEXT_LAYER,
    MEDIA_CONFIG,
    MEDIA_MANIFEST,
    MEDIA_MODEL,
    REPLACEABLE,
    ModelStore,
    parse_digest,
)
from jupyter_llm.request.errors import InsufficientStorage, InvalidRequest, PullFailed

DEFAULT_QUANT = "Q4_K_M"
HF_HOSTS = ("hf.co", "huggingface.co")
MANIFEST_ACCEPT = f"{MEDIA_MANIFEST}, application/vnd.oci.image.manifest.v1+json"

Progress = dict[str, Any]


class Puller:
    """Owns the HTTP client and the table of downloads in progress."""

    def __init__(
        self,
        store: ModelStore,
        hf_endpoint: str = "https://huggingface.co",
        trusted_hosts: str = "",
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        """``hf_endpoint`` and ``trusted_hosts`` come from ``Settings``
        (``HF_ENDPOINT``, ``JUPYTER_LLM_TRUSTED_AUTH_HOSTS``)."""
        self.store = store
        self.retry = retry  # attempts and backoff for an interrupted blob
        self.hf_endpoint = (hf_endpoint or "https://huggingface.co").rstrip("/")
        # token hosts trusted beside each registry's own (see models/hosts.py)
        self.trusted_auth_hosts = trusted_auth_hosts(trusted_hosts)
        self._downloads: dict[str, Download] = {}
        self.running = 0  # pulls begun and not yet ended (their HTTP client closed)

    # -- entry point ---------------------------------------------------------------
    async def pull(
        self, source: str, *, insecure: bool = False, name: str | None = None
    ) -> AsyncIterator[Progress]:
        """Progress dicts as Ollama streams them, ending with ``{"status": "success"}``."""
        if not isinstance(source, str) or not source.strip():
            raise InvalidRequest("model is required and must be a non-empty string")
        source = source.strip()
        self.running += 1
        try:
            async with _client() as client:
                if re.match(r"^https?://", source, re.I):
                    gen = self._pull_url(client, source, name, insecure)
                else:
                    model = parse_model_name(source)
                    if model.host in HF_HOSTS:
                        gen = self._pull_hf(client, model)
                    else:
                        gen = self._pull_registry(client, model, insecure)
                async with contextlib.aclosing(gen):  # closed at once, and its downloads told
                    async for event in gen:
                        yield event
        finally:
            self.running -= 1

    # -- Ollama registry -----------------------------------------------------------
    async def _pull_registry(
        self, client: httpx.AsyncClient, model: ModelName, insecure: bool
    ) -> AsyncIterator[Progress]:
        scheme = "http" if insecure else "https"
        base = f"{scheme}://{model.host}/v2/{model.namespace}/{model.name}"
        yield {"status": "pulling manifest"}
        response = await self._get(
            client,
            f"{base}/manifests/{model.tag}",
            MAX_MANIFEST,
            insecure=insecure,
            headers={"Accept": MANIFEST_ACCEPT},
        )
        if response.status_code == 404:
            raise PullFailed(f"pull model manifest: file does not exist: {model.display}", 404)
        if response.status_code == 401:
            raise PullFailed(f"pull model manifest: the registry refused access to {model.display}")
        raw = response.content
        layers, config = validate_manifest(raw)
        async with self._hold([la["digest"] for la in [*layers, config]]) as hold:
            await self._check_disk(
                [la["size"] for la in [*layers, config] if not await self._has(la["digest"])]
            )
            for layer in [*layers, config]:
                digest, size = layer["digest"], layer["size"]
                url = f"{base}/blobs/{digest}"
                async with contextlib.aclosing(self._fetch_blob(url, digest, size, hold)) as blob:
                    async for event in blob:
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
            client, f"{self.hf_endpoint}/api/models/{repo}", MAX_HF_API, params={"blobs": "true"}
        )
        if response.status_code in (401, 404):
            raise PullFailed(f"pull model manifest: no such Hugging Face repo: {repo}", 404)
        try:
            siblings = response.json().get("siblings", [])
        except ValueError:
            raise PullFailed("pull model manifest: Hugging Face sent invalid JSON") from None
        file, digest, size = pick_gguf(siblings, quant)
        projector = pick_projector(siblings)  # a vision model's mmproj file, if the repo has one
        wanted = [(file, digest, size), *([projector] if projector else [])]
        async with self._hold([d for _, d, _ in wanted if d]) as hold:
            await self._check_disk([n for _, d, n in wanted if not (d and await self._has(d))])
            files: dict[str, str] = {}
            for name, known, n in wanted:
                url = f"{self.hf_endpoint}/{repo}/resolve/main/{name}"
                async with contextlib.aclosing(self._fetch_blob(url, known, n, hold)) as blob:
                    async for event in blob:
                        if event.get("digest"):
                            known = event["digest"]
                        yield event
                if known is None:
                    raise PullFailed("the download produced no file")
                files[Path(name).name] = known
            named = ModelName("hf.co", model.namespace, model.name, quant)
            async for event in self._finish_gguf(named, files):
                yield event

    # -- direct URL ----------------------------------------------------------------
    async def _pull_url(
        self, client: httpx.AsyncClient, url: str, name: str | None, insecure: bool
    ) -> AsyncIterator[Progress]:
        parsed = urlparse(url)
        if parsed.scheme.lower() == "http" and not insecure and not is_loopback(parsed.hostname):
            raise InvalidRequest('plain http pulls need "insecure": true')
        file = Path(parsed.path).name
        if not file.lower().endswith(".gguf"):
            raise InvalidRequest("a URL pull must name a .gguf file")
        model = parse_model_name(name or url_model_name(file), "name")
        yield {"status": "pulling manifest"}
        head = await self._get(client, url, 0, method="HEAD", insecure=insecure)
        length = head.headers.get("content-length", "")
        size = int(length) if length.isdigit() else 0  # 0: unknown until the GET
        await self._check_disk([size])
        digest = None
        async with self._hold([]) as hold:
            async with contextlib.aclosing(self._fetch_blob(url, None, size, hold)) as blob:
                async for event in blob:
                    digest = event.get("digest") or digest
                    yield event
            if digest is None:
                raise PullFailed("the download produced no file")
            async for event in self._finish_gguf(model, {file: digest}):
                yield event

    async def _finish_gguf(
        self, model: ModelName, files: dict[str, str]
    ) -> AsyncIterator[Progress]:
        """Create the model from its downloaded GGUFs (the store tells a projector
        from the model by its header)."""
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.store.create(model, files)
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
        self, url: str, digest: str | None, size: int, hold: Hold
    ) -> AsyncIterator[Progress]:
        """Download (or join the download of) one blob, reporting progress. The
        blob joins ``hold`` in the same step that moves it into the store. The
        download has its own HTTP client: it outlives the pull that began it
        while other pulls follow it."""
        if digest is not None and await self._has(digest):
            yield {
                "status": f"pulling {digest[7:19]}",
                "digest": digest,
                "total": size,
                "completed": size,
            }
            return
        key = digest or f"url:{url}"
        download = self._downloads.get(key)
        if download is not None and download.followers == 0 and download.task is not None:
            await asyncio.wait({download.task})  # being cancelled: let it close the partial
            download = None
        if download is None or download.task is None or download.task.done():
            download = Download(digest=digest, total=size)
            download.task = asyncio.ensure_future(self._run_download(url, download))
            self._downloads[key] = download
        download.holds.append(hold)
        download.followers += 1
        task = download.task
        label = digest[7:19] if digest else Path(urlparse(url).path).name[:24]
        told = len(download.retries)  # retries before this pull joined are not its news
        try:
            while not task.done():
                for note in download.retries[told:]:
                    yield {"status": retry_line(label, note)}
                told = len(download.retries)
                yield {
                    "status": f"pulling {label}",
                    "digest": digest or "",
                    "total": download.total,
                    "completed": download.completed,
                }
                await asyncio.wait({task}, timeout=0.5)
            for note in download.retries[told:]:
                yield {"status": retry_line(label, note)}
            final = task.result()
            await asyncio.get_running_loop().run_in_executor(None, self._keep, hold, final)
        finally:
            download.followers -= 1
            if download.followers == 0 and not task.done():
                # the last pull following it left (its client went away): stop it,
                # whether it is receiving or waiting to retry; the partial stays
                task.cancel()
                await asyncio.wait({task})
            if task.done() and self._downloads.get(key) is download:
                del self._downloads[key]
        yield {
            "status": f"pulling {label}",
            "digest": final,
            "total": download.total,
            "completed": download.total,
        }

    async def _run_download(self, url: str, download: Download) -> str:
        async with _client() as client:
            return await _download.fetch(client, url, self.store, download, self.retry)

    def in_progress(self) -> dict[str, int]:
        """The downloads running now (a digest, or ``url:`` and the URL), each
        with the number of pulls following it."""
        return {
            key: d.followers for key, d in self._downloads.items() if d.task and not d.task.done()
        }

    async def _has(self, digest: str) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.store.has_blob, digest)

    def _keep(self, hold: Hold, digest: str) -> None:
        """Make sure a shared download's blob is in this pull's hold (a pull that
        joined after the blob was moved into place adds it here)."""
        with self.store.lock:
            if not self.store.has_blob(digest):
                raise PullFailed(f"blob {digest} was deleted during the pull: pull again")
            hold.add(digest)

    async def _get(
        self,
        client: httpx.AsyncClient,
        url: str,
        cap: int,
        method: str = "GET",
        insecure: bool = False,
        **kwargs: Any,
    ) -> Answer:
        """A small answer (at most ``cap`` bytes), with registry token auth from a
        realm that ``check_realm`` allows."""
        what = f"pull {url}"
        try:
            response = await read_capped(client, method, url, cap, what, **kwargs)
            if response.status_code == 401 and (
                token := await _bearer_token(
                    client, response, url, insecure, self.trusted_auth_hosts
                )
            ):
                headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {token}"}
                response = await read_capped(
                    client, method, url, cap, what, headers=headers, **kwargs
                )
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


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        follow_redirects=True, timeout=httpx.Timeout(30.0, read=300.0), trust_env=True
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
    for la in checked:
        if (la["mediaType"] in REPLACEABLE or la is checked[-1]) and la["size"] > MAX_TEXT_LAYER:
            raise PullFailed(
                f"pull model manifest: layer {la['digest']} is too large for "
                f"{la['mediaType'] or 'a config'} ({la['size']} bytes, at most {MAX_TEXT_LAYER})"
            )
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
    return _sibling(sorted(matches, key=lambda s: len(s["rfilename"]))[0])


# A repo's projector, when it has several precisions: the one llama.cpp's
# own repos (ggml-org) and most others publish first.
PROJECTOR_PREFERENCE = ("f16", "bf16", "f32", "q8_0")


def pick_projector(siblings: list[dict[str, Any]]) -> tuple[str, str | None, int] | None:
    """The repo's mmproj GGUF (its sha256 and size), or None: a repo with
    several takes the first precision of ``PROJECTOR_PREFERENCE`` found in
    the names, else the shortest name."""
    found = [
        s
        for s in siblings
        if str(s.get("rfilename", "")).lower().endswith(".gguf")
        and "mmproj" in Path(str(s["rfilename"])).name.lower()
    ]
    if not found:
        return None

    def rank(s: dict[str, Any]) -> tuple[int, int, str]:
        name = Path(s["rfilename"]).name.lower()
        words = re.split(r"[-_.]", name)
        hits = [i for i, p in enumerate(PROJECTOR_PREFERENCE) if p in words]
        return (hits[0] if hits else len(PROJECTOR_PREFERENCE), len(name), name)

    return _sibling(sorted(found, key=rank)[0])


def _sibling(choice: dict[str, Any]) -> tuple[str, str | None, int]:
    lfs = choice.get("lfs") or {}
    digest = (
        f"sha256:{lfs['sha256']}" if re.fullmatch(r"[0-9a-f]{64}", str(lfs.get("sha256"))) else None
    )
    return choice["rfilename"], digest, int(lfs.get("size") or choice.get("size") or 0)


def retry_line(label: str, note: RetryNote) -> str:
    """The status line announcing a retry (shown by Ollama's client as a line of its own)."""
    return (
        f"retrying {label} in {note.delay:g}s from byte {note.offset} "
        f"(attempt {note.attempt} of {note.attempts}): {note.reason}"
    )


def url_model_name(file: str) -> str:
    stem = re.sub(r"[^a-z0-9_.-]+", "-", Path(file).stem.lower()).strip("-.") or "model"
    return f"{stem[:80]}:latest"


def _quant_of(filename: str) -> str | None:
    m = re.search(r"((?:I?Q\d[\w]*?)|F16|F32|BF16)(?:\.gguf$|-)", filename, re.I)
    return m.group(1).upper() if m else None


async def _bearer_token(
    client: httpx.AsyncClient,
    response: Answer,
    url: str,
    insecure: bool,
    trusted: frozenset[tuple[str, int | None]],
) -> str | None:
    """Docker-registry token auth: ask WWW-Authenticate's realm for a token, if
    the realm is one ``check_realm`` allows for ``url`` (raises otherwise). The
    token request follows no redirect, which could lead anywhere."""
    challenge = response.headers.get("www-authenticate", "")
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    check_realm(realm, url, insecure=insecure, trusted=trusted)
    try:
        reply = await read_capped(
            client,
            "GET",
            realm,
            MAX_TOKEN,
            "registry token",
            params=params,
            follow_redirects=False,
        )
        answer = reply.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(answer, dict):
        return None
    token = answer.get("token") or answer.get("access_token")
    return token if isinstance(token, str) else None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
