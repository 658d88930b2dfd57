"""The one lock of a model store, across threads and processes.

Manifest writes (with the blobs they reference) and blob collection take it,
so a delete can never free a blob that a create, copy or pull is about to
reference. Threads of one process share a reentrant lock; processes (the
server and an embedded CLI on the same store) meet at an ``fcntl.flock`` on a
file in the store. All methods block: call them from an executor in the server.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

_locks: dict[Path, StoreLock] = {}
_locks_guard = threading.Lock()


def store_lock(path: Path) -> StoreLock:
    """The process's one lock for ``path``: two stores opened on one directory
    in one process must not hold two flocks that would block each other."""
    key = Path(os.path.abspath(path))
    with _locks_guard:
        if key not in _locks:
            _locks[key] = StoreLock(key)
        return _locks[key]


class StoreLock:
    """Reentrant inside a process (per thread), exclusive between processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._waiting = 0
        self._count = threading.Lock()

    @property
    def waiting(self) -> int:
        """How many callers are blocked on the lock now (observable by tests)."""
        return self._waiting

    def acquire(self, blocking: bool = True) -> bool:
        if not self._thread_lock.acquire(blocking=False):
            if not blocking:
                return False
            self._blocked(self._thread_lock.acquire)
        try:
            if self._depth == 0 and not self._lock_file(blocking):
                self._thread_lock.release()
                return False
        except BaseException:
            self._thread_lock.release()
            raise
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._thread_lock.release()

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def _lock_file(self, blocking: bool) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not blocking:
                    os.close(fd)
                    return False
                self._blocked(lambda: fcntl.flock(fd, fcntl.LOCK_EX))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def _blocked(self, wait: Callable[[], object]) -> None:
        with self._count:
            self._waiting += 1
        try:
            wait()
        finally:
            with self._count:
                self._waiting -= 1
