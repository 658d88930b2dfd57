"""Pending blob references: blobs a pull reuses or has downloaded whose manifest
is not written yet. Collection counts them like a manifest's references.

Each hold is a small file in the store, so collectors in other processes see
it too. Its owner keeps a shared flock on it while it lives; the kernel drops
that flock when the owner dies, so a hold left behind by a killed process is
recognised (the collector can take the flock exclusively) and removed.
Every method takes the store lock; call them from an executor in the server.

A digest may be held until a time (``Hold.add(digest, until=...)``): an
uploaded blob waiting for its ``/api/create``. The time is written into the
hold, and every collector, in any process, ignores the digest once its clock
(wall time, by default ``time.time``) has passed it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

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
        self.until: dict[str, float] = {}  # digests held until a time, not for good

    @property
    def released(self) -> bool:
        return self._fd is None

    def add(self, digest: str, until: float | None = None) -> None:
        """Keep ``digest`` too (until the clock reads ``until``, if given); a
        released hold keeps nothing and ignores this."""
        with self._holds.lock:
            if self._fd is None:
                return
            if until is None:
                self.digests.add(digest)
                self.until.pop(digest, None)
            elif digest not in self.digests:
                self.until[digest] = max(until, self.until.get(digest, until))
            self._holds.write(self._fd, self.digests, self.until)

    def remove(self, digests: Iterable[str], *, expired: bool = False) -> None:
        """Stop keeping the timed ``digests`` (with ``expired``: also every
        timed digest whose time has passed)."""
        with self._holds.lock:
            if self._fd is None:
                return
            gone = set(digests)
            if expired:
                now = self._holds.clock()
                gone |= {d for d, t in self.until.items() if t <= now}
            if gone & self.until.keys():
                for digest in gone:
                    self.until.pop(digest, None)
                self._holds.write(self._fd, self.digests, self.until)

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

    def __init__(
        self, directory: Path, lock: StoreLock, clock: Callable[[], float] = time.time
    ) -> None:
        self.directory = directory
        self.lock = lock
        self.clock = clock  # wall time: holds written by other processes compare with it

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
        """Every digest a live hold keeps (a timed one until its time); removes
        the holds of dead processes. Raises ``HoldUnreadable`` when a live hold
        cannot be read."""
        digests: set[str] = set()
        with self.lock:
            if not self.directory.is_dir():
                return digests
            now = self.clock()
            for path in self.directory.iterdir():
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # its owner is alive
                    kept, until = _read(fd, path)
                    digests |= kept | {d for d, t in until.items() if t > now}
                else:
                    path.unlink(missing_ok=True)
                finally:
                    os.close(fd)
        return digests

    @staticmethod
    def write(fd: int, digests: set[str], until: dict[str, float] | None = None) -> None:
        """A list of digests; with timed ones, ``{"digests": [...], "until":
        {digest: time}}`` (a plain hold keeps the format older versions read)."""
        value: Any = sorted(digests)
        if until:
            value = {"digests": value, "until": dict(sorted(until.items()))}
        data = json.dumps(value).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


def _read(fd: int, path: Path) -> tuple[set[str], dict[str, float]]:
    """(digests held for good, timed digests) of one hold file."""
    try:
        value = json.loads(os.pread(fd, os.fstat(fd).st_size, 0))
    except (OSError, ValueError) as e:
        raise HoldUnreadable(f"{path}: {e}") from None
    until: Any = {}
    if isinstance(value, dict):
        value, until = value.get("digests"), value.get("until")
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise HoldUnreadable(f"{path}: not a list of digests")
    if not isinstance(until, dict) or not all(
        isinstance(d, str) and isinstance(t, int | float) for d, t in until.items()
    ):
        raise HoldUnreadable(f"{path}: not a map of digests to times")
    return set(value), {d: float(t) for d, t in until.items()}
