"""How a model's blob reaches the node that loads it.

A node that sees the engine's path (a shared filesystem) with the same size
loads it from there. Otherwise the engine sends the blob in chunks and the
node writes it into its own store's ``blobs/`` (content-addressed, so a blob
arrives once per node), checking the sha256 digest before it is used.

A digest names a file on the node, so it is checked (the store's own
``parse_digest``: ``sha256:`` and 64 lowercase hex digits) before any path
is built from it: no ``../`` in a digest can reach outside ``blobs/``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from jupyter_llm.models.store import parse_digest
from jupyter_llm.request.errors import ModelLoadFailed

CHUNK = 8 << 20  # bytes per message: bounded memory at both ends
_BLOB_NAME = re.compile(r"sha256-([0-9a-f]{64})")


class BlobMismatch(ModelLoadFailed):
    """A blob arrived at a node with another digest than the one it was sent as."""


def digest_of_name(path: str) -> str | None:
    """The digest a store blob is named by (``blobs/sha256-<hex>``), else None."""
    match = _BLOB_NAME.fullmatch(Path(path).name)
    return f"sha256:{match.group(1)}" if match else None


def file_digest(path: str) -> str:
    """Blocking: run it in an executor."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def read_chunk(path: str, offset: int) -> bytes:
    """Blocking: the chunk of ``path`` at ``offset`` (b"" at the end)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(CHUNK)


class BlobReceiver:
    """The node's side: which blobs it has, and blobs arriving in chunks."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._partial: dict[str, tuple[Path, hashlib._Hash, int]] = {}

    @staticmethod
    def shared(path: str, size: int) -> bool:
        """Does this node see the engine's file (same path, same size)?"""
        try:
            return os.stat(path).st_size == size
        except OSError:
            return False

    def path_of(self, digest: str) -> Path:
        """Where the blob ``digest`` lives here; ``InvalidRequest`` for
        anything but a sha256 digest, before a path is made of it."""
        return self.directory / parse_digest(digest).replace(":", "-")

    def cached(self, digest: str, size: int) -> str | None:
        path = self.path_of(digest)
        return str(path) if self.shared(str(path), size) else None

    def write(self, digest: str, offset: int, data: bytes) -> None:
        """Chunks arrive in order, from offset 0."""
        digest = parse_digest(digest)
        if offset == 0:
            self.discard(digest)
            self.directory.mkdir(parents=True, exist_ok=True)
            part = self.path_of(digest).with_suffix(f".partial-{os.getpid()}")
            part.write_bytes(b"")
            self._partial[digest] = (part, hashlib.sha256(), 0)
        part, h, written = self._partial[digest]
        if offset != written:
            self.discard(digest)
            raise ModelLoadFailed(f"blob {digest}: chunk at {offset}, expected {written}")
        with open(part, "ab") as f:
            f.write(data)
        h.update(data)
        self._partial[digest] = (part, h, written + len(data))

    def finish(self, digest: str) -> str:
        """The verified blob's path; ``BlobMismatch`` (and nothing kept) if
        its content is not ``digest``."""
        digest = parse_digest(digest)
        part, h, _ = self._partial.pop(digest)
        got = f"sha256:{h.hexdigest()}"
        if got != digest:
            part.unlink(missing_ok=True)
            raise BlobMismatch(f"the model file arrived with digest {got}, expected {digest}")
        final = self.path_of(digest)
        os.replace(part, final)
        return str(final)

    def discard(self, digest: str) -> None:
        digest = parse_digest(digest)
        if (partial := self._partial.pop(digest, None)) is not None:
            partial[0].unlink(missing_ok=True)
