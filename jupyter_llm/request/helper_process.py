"""The server's helper processes: CPU-heavy pure Python on untrusted input,
run where it shares no GIL with the server.

A thread of the server shares the GIL with its event loop, so a second of
pure Python there (checking a body of 16M values, reading a hostile 4 MiB
chat template) makes every other user's request wait for the GIL at each
step: ``/api/tags`` answered 2.3-2.7x slower beside one template read
(tests/attacks). Work sent here runs in another interpreter at the lowest
CPU priority, so the loop and the runners keep their time.

The processes are spawned (no copy of the server's threads) on first use,
up to ``WORKERS``, so one long read does not hold up another user's body
check; a pool whose process died is replaced once. ``stop`` at the server's
shutdown; they also end with the server's process.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")

WORKERS = 2  # processes at most: each costs an interpreter (about 30 MiB)

_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()


def run(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a helper process; blocks the calling thread, so call
    it off the event loop. ``fn`` must be importable by name and its
    arguments and result picklable; what it raises is raised here."""
    global _pool
    for attempt in (1, 2):
        with _lock:
            _main_readable_by_spawn()
            if _pool is None:
                _pool = ProcessPoolExecutor(
                    WORKERS, mp_context=multiprocessing.get_context("spawn"), initializer=_lowly
                )
            pool = _pool
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            with _lock:
                if _pool is pool:
                    _pool = None
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def stop() -> None:
    """End the helper processes (the server's shutdown)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _main_readable_by_spawn() -> None:
    """Spawning a process reads ``__main__.__spec__``, which a host that
    swapped ``__main__`` for a namespace of its own (IPython's shell, a
    pytest-xdist worker) may lack. None there: nothing of it is needed."""
    main = sys.modules.get("__main__")
    if main is not None and not hasattr(main, "__spec__"):
        main.__spec__ = None


def _lowly() -> None:
    """A helper yields the CPU to the server and the runners."""
    os.nice(19)
