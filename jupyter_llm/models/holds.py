"""Pending blob references: blobs a pull reuses or has downloaded whose manifest
is not written yet. Collection counts them like a manifest's references.

Each hold is a small file in the store, so collectors in other processes see
it too. Its owner keeps a shared flock on it while it lives; the kernel drops
that flock when the owner dies, so a hold left behind by a killed process is
recognised (the collector can take the flock exclusively) and removed.
Every method takes the store lock; call them from an executor in the server.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from jupyter_llm.models.store_lock import StoreLock


class HoldUnreadable(ValueError):
    """A live hold file could not be read: its references are unknown."""


class Hold:
    """Digests one operation keeps alive until ``release``."""

    def __init__(self, holds: BlobHolds, path: Path, fd: int, digests: set[str]) -> None:
        self._holds = holds
        self.path = path
        self._fd: int | None = fd
        self.digests = digests

    @property
    def released(self) -> bool:
        return self._fd is None

    def add(self, digest: str) -> None:
        """Keep ``digest`` too; a released hold keeps nothing and ignores this."""
        with self._holds.lock:
            if self._fd is None:
                return
            self.digests.add(digest)
            self._holds.write(self._fd, self.digests)

    def release(self) -> None:
        with self._holds.lock:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            self.path.unlink(missing_ok=True)
            os.close(fd)

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class BlobHolds:
    """The holds of one store, in ``directory``."""

    def __init__(self, directory: Path, lock: StoreLock) -> None:
        self.directory = directory
        self.lock = lock

    def hold(self, digests: Iterable[str] = ()) -> Hold:
        with self.lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / uuid.uuid4().hex
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                held = set(digests)
                self.write(fd, held)
            except BaseException:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
            return Hold(self, path, fd, held)

    def held(self) -> set[str]:
        """Every digest a live hold keeps; removes the holds of dead processes.
        Raises ``HoldUnreadable`` when a live hold cannot be read."""
        digests: set[str] = set()
        with self.lock:
            if not self.directory.is_dir():
                return digests
            for path in self.directory.iterdir():
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # its owner is alive
                    digests |= _read(fd, path)
                else:
                    path.unlink(missing_ok=True)
                finally:
                    os.close(fd)
        return digests

    @staticmethod
    def write(fd: int, digests: set[str]) -> None:
        data = json.dumps(sorted(digests)).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


def _read(fd: int, path: Path) -> set[str]:
    try:
        value = json.loads(os.pread(fd, os.fstat(fd).st_size, 0))
    except (OSError, ValueError) as e:
        raise HoldUnreadable(f"{path}: {e}") from None
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise HoldUnreadable(f"{path}: not a list of digests")
    return set(value)
