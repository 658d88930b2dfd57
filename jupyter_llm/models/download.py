"""One blob download into the store, careful of the server and of the disk.

The bytes go to ``blobs/<key>-partial``; beside it ``<key>-partial.meta`` keeps
the validator (ETag or Last-Modified) of the file being fetched. A resume asks
for the rest with ``Range`` and ``If-Range: <validator>``, and is accepted only
as a 206 whose ``Content-Range`` starts where the partial ends and whose
validator is unchanged; anything else starts again from byte 0, so two
different files are never spliced together. A body never grows past its
declared size (the manifest's, Hugging Face's or the HEAD's), and a full disk
removes the partial rather than keeping a full disk for a resume.

An interrupted attempt (the connection dropped or timed out, the body ended
short, the server answered 5xx) is tried again by itself, resuming after the
bytes already kept, up to ``RetryPolicy.attempts`` times with a doubling wait
between; each retry is noted on the ``Download`` for the pulls to announce.
Other failures (4xx, a digest mismatch, a server that cannot resume
consistently) end the download at once, as before. When the attempts are used
up the partial stays for a later pull to resume.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from jupyter_llm.models.holds import Hold
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import InsufficientStorage, PullFailed

CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts an interrupted blob download gets, and the waits
    between them: ``base_delay`` seconds, doubling after each failure, at most
    ``max_delay``."""

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f"invalid retry policy: {self}")

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failed attempt (1, 2, ...)."""
        return min(self.max_delay, self.base_delay * 2 ** (failures - 1))


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class RetryNote:
    """A retry about to happen: attempt ``attempt`` of ``attempts`` starts
    after ``delay`` seconds, because of ``reason``; it resumes at byte ``offset``."""

    attempt: int
    attempts: int
    delay: float
    reason: str
    offset: int


@dataclass
class Download:
    """One blob being fetched; shared by every pull that needs it. ``total`` is
    its declared size (0: unknown until the server says). ``completed`` only
    grows, unless the server's file changed and the download starts again."""

    digest: str | None
    total: int
    completed: int = 0
    task: asyncio.Task[str] | None = None
    holds: list[Hold] = field(default_factory=list)  # of the pulls waiting on it
    retries: list[RetryNote] = field(default_factory=list)  # in order, never removed
    followers: int = 0  # pulls reporting its progress; the last to leave cancels it


@dataclass
class _Kept:
    """The partial as it stands: its bytes' hash, length and validator."""

    hasher: Any
    size: int = 0
    validator: str | None = None

    def reset(self) -> None:
        self.hasher, self.size, self.validator = hashlib.sha256(), 0, None


class _Restart(Exception):
    """The partial cannot be continued: start again from byte 0."""


class Interrupted(Exception):
    """An attempt that another may follow: the body ended short, or the server
    answered 5xx."""


def is_retryable(error: BaseException) -> bool:
    """Whether a download attempt that failed with ``error`` is worth another:
    transport failures (connection refused or dropped, timeouts, a body cut
    short) and ``Interrupted``; never a refusal, a mismatch or our own bug."""
    if isinstance(error, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
        return False
    return isinstance(error, (httpx.TransportError, Interrupted))


def retry_status(status: int) -> bool:
    """Whether an HTTP status ends an attempt that another may follow (5xx)."""
    return 500 <= status <= 599


def _reason(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, Interrupted):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def write_chunk(out: BinaryIO, hasher: Any, data: bytes) -> None:
    """The file-write boundary (tests replace it to fill the disk)."""
    out.write(data)
    hasher.update(data)


class Partial:
    """The partial file of one download and its validator."""

    def __init__(self, blobs_dir: Path, key: str) -> None:
        self.path = blobs_dir / f"{key}-partial"
        self.meta = blobs_dir / f"{key}-partial.meta"

    def resume_point(self, hasher: Any, need_validator: bool) -> tuple[int, str | None]:
        """Bytes already here (hashed into ``hasher``) and their validator. With
        ``need_validator`` a partial of unknown provenance is thrown away."""
        validator = self._validator()
        if not self.path.exists() or (need_validator and validator is None):
            self.discard()
            return 0, None
        size = 0
        with open(self.path, "rb") as f:
            while chunk := f.read(CHUNK):
                hasher.update(chunk)
                size += len(chunk)
        return size, validator

    def begin(self, validator: str | None) -> BinaryIO:
        """Empty the partial for a new file, recording its validator first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.meta.unlink(missing_ok=True)
        out = open(self.path, "wb")
        if validator is not None:
            self.meta.write_text(json.dumps({"validator": validator}))
        return out

    def append(self) -> BinaryIO:
        return open(self.path, "ab")

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.meta.unlink(missing_ok=True)

    def _validator(self) -> str | None:
        try:
            value = json.loads(self.meta.read_text()).get("validator")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    store: ModelStore,
    d: Download,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> str:
    """Fetch ``url`` for ``d``; returns the verified digest once the blob is in
    the store (and in every waiting pull's hold). Interrupted attempts are
    tried again as ``retry`` says, each resuming where the last one stopped."""
    loop = asyncio.get_running_loop()
    key = d.digest.replace(":", "-") if d.digest else f"url-{_url_key(url)}"
    partial = Partial(store.blobs_dir, key)
    kept = _Kept(hashlib.sha256())
    # a known digest proves the result anyway; a URL's bytes need their validator
    kept.size, kept.validator = await loop.run_in_executor(
        None, partial.resume_point, kept.hasher, d.digest is None
    )
    try:
        await _attempts(client, url, partial, d, kept, retry)
    except httpx.HTTPError as e:
        raise PullFailed(f"download {url} failed ({type(e).__name__}): {e}") from e
    except _Restart:
        await loop.run_in_executor(None, partial.discard)
        raise PullFailed(f"download {url}: the server cannot resume consistently") from None
    except OSError as e:  # writing the partial: nothing of it is worth keeping
        await loop.run_in_executor(None, partial.discard)
        if e.errno in _FULL_DISK:
            raise InsufficientStorage(
                f"the disk filled during the download ({e.strerror}); "
                "the partial file was removed: free space and pull again"
            ) from None
        raise PullFailed(f"writing {partial.path.name}: {e.strerror or e}") from None
    actual = f"sha256:{kept.hasher.hexdigest()}"
    if d.digest is not None and actual != d.digest:
        await loop.run_in_executor(None, partial.discard)
        raise PullFailed(
            f"digest mismatch, file must be downloaded again: want {d.digest}, got {actual}"
        )
    await loop.run_in_executor(None, _adopt, store, partial, actual, list(d.holds))
    d.total = d.completed = max(d.completed, d.total)
    return actual


def _url_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:32]


async def _attempts(
    client: httpx.AsyncClient,
    url: str,
    partial: Partial,
    d: Download,
    kept: _Kept,
    retry: RetryPolicy,
) -> None:
    """Attempts until one ends the download, each resuming where the last
    stopped, as ``retry`` says; the last failure is a ``PullFailed``."""
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        try:
            await _attempt(client, url, partial, d, kept)
            return
        except Exception as e:
            if not is_retryable(e):
                raise
            failures += 1
            if failures >= retry.attempts:
                raise PullFailed(
                    f"download interrupted after {failures} "
                    f"attempt{'s' if failures > 1 else ''} (the last: {_reason(e)}); "
                    f"{kept.size} of {d.total or '?'} bytes are kept: "
                    "pull again to resume where it stopped"
                ) from e
            delay = retry.delay(failures)
            if d.digest is None and kept.validator is None:
                # nothing proves the server still has the same file: begin again
                await loop.run_in_executor(None, partial.discard)
                kept.reset()
            d.retries.append(RetryNote(failures + 1, retry.attempts, delay, _reason(e), kept.size))
            await asyncio.sleep(delay)


async def _attempt(
    client: httpx.AsyncClient, url: str, partial: Partial, d: Download, kept: _Kept
) -> None:
    """One attempt: continue the partial, or start again once if it cannot be
    continued. Raises ``Interrupted`` (or a transport error) for a retry."""
    try:
        await _transfer(client, url, partial, d, kept)
    except _Restart:
        await asyncio.get_running_loop().run_in_executor(None, partial.discard)
        kept.reset()
        await _transfer(client, url, partial, d, kept)
    if d.total and kept.size < d.total:
        raise Interrupted(f"the body ended after {kept.size} of {d.total} bytes")


async def _transfer(
    client: httpx.AsyncClient, url: str, partial: Partial, d: Download, kept: _Kept
) -> None:
    """One GET: the rest of the partial (``kept.size`` > 0) or the whole file.
    ``kept`` follows every byte written, however the GET ends."""
    loop = asyncio.get_running_loop()
    have = kept.size
    headers = {"Accept-Encoding": "identity"}  # sizes are of the bytes stored
    if have:
        headers["Range"] = f"bytes={have}-"
    if have and kept.validator:
        headers["If-Range"] = kept.validator
    async with client.stream("GET", url, headers=headers) as response:
        status = response.status_code
        if status == 416 and have:
            if d.digest is not None and have == d.total:
                d.completed = have  # it was all here already; the digest decides
                return
            raise _Restart
        if retry_status(status):
            raise Interrupted(f"HTTP {status}")
        if status not in (200, 206):
            raise PullFailed(f"download {url}: HTTP {status}")
        if status == 206:
            _check_resume(response, have, kept.validator, d.total)
        else:
            have = 0  # a whole body: the server ignored the Range, or the file changed
        length = _content_length(response)
        if d.total and length is not None and have + length != d.total:
            how = "more than" if have + length > d.total else "not"
            raise PullFailed(
                f"download {url}: the server offers {have + length} bytes, "
                f"{how} the {d.total} declared"
            )
        if not d.total and length is not None:
            d.total = have + length
        limit = d.total or None
        if have:
            out = await loop.run_in_executor(None, partial.append)
        else:
            kept.reset()
            kept.validator = _validator_of(response)
            out = await loop.run_in_executor(None, partial.begin, kept.validator)
        d.completed = have
        try:
            await _receive(response, out, kept, d, limit, partial, url)
        finally:
            await loop.run_in_executor(None, out.close)


async def _receive(
    response: httpx.Response,
    out: BinaryIO,
    kept: _Kept,
    d: Download,
    limit: int | None,
    partial: Partial,
    url: str,
) -> None:
    """Write the body in ~1 MiB steps off the loop, never past ``limit``.
    A failed write raises its ``OSError``."""
    loop = asyncio.get_running_loop()
    pending: list[bytes] = []
    size = 0

    async def flush() -> None:
        nonlocal pending, size
        data, pending, size = b"".join(pending), [], 0
        await loop.run_in_executor(None, write_chunk, out, kept.hasher, data)
        kept.size += len(data)

    try:
        async for chunk in response.aiter_bytes():
            if limit is not None and d.completed + len(chunk) > limit:
                await loop.run_in_executor(None, partial.discard)
                kept.reset()
                raise PullFailed(
                    f"download {url}: the server sent more than the {limit} bytes declared"
                )
            pending.append(chunk)
            size += len(chunk)
            d.completed += len(chunk)
            if size >= CHUNK:
                await flush()
            if limit is not None and d.completed == limit:
                break  # all that was declared is here: read no further
    finally:  # keep what arrived, so that a retry resumes after it
        if pending and partial.path.exists():
            await flush()


def _check_resume(response: httpx.Response, have: int, validator: str | None, total: int) -> None:
    """A 206 continues the partial only from its end, and of the same file."""
    m = _CONTENT_RANGE.match(response.headers.get("content-range", "").strip())
    if not m or int(m.group(1)) != have:
        raise _Restart
    if total and m.group(3) != "*" and int(m.group(3)) != total:
        raise _Restart
    seen = _validator_of(response)
    if validator and seen and seen != validator:
        raise _Restart


def _validator_of(response: httpx.Response) -> str | None:
    """A strong ETag, else Last-Modified: what If-Range may name (RFC 9110)."""
    tag = response.headers.get("etag")
    if tag and not tag.startswith("W/"):
        return tag
    return response.headers.get("last-modified") or None


def _content_length(response: httpx.Response) -> int | None:
    """The size of the stored bytes, where the server states it."""
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        return None
    try:
        value = int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def _adopt(store: ModelStore, partial: Partial, digest: str, holds: list[Hold]) -> None:
    store.adopt_blob(partial.path, digest, holds)
    partial.meta.unlink(missing_ok=True)
