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

Work that may not end on its own (a schema's regular expressions run on a
model's output: Python's ``re`` backtracks without bound and never lets go
of the GIL) goes through ``run_limited``, which gives it a budget of CPU
seconds in the helper: a timer on the process's own CPU time interrupts it
there, whatever the machine's load (``re`` looks for signals as it
matches), and the helper lives on for the next task.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
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
    for attempt in (1, 2):
        pool = _current_pool()
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            _forget(pool)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _current_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        _main_readable_by_spawn()
        if _pool is None:
            _pool = ProcessPoolExecutor(
                WORKERS, mp_context=multiprocessing.get_context("spawn"), initializer=_lowly
            )
        return _pool


def _forget(pool: ProcessPoolExecutor) -> None:
    """A pool whose process died: the next task starts a new one."""
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None


class CpuLimitExceeded(Exception):
    """A ``run_limited`` task used up its CPU seconds and was interrupted."""


async def run_limited(cpu_seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a helper process, interrupted once it has used
    ``cpu_seconds`` of the helper's CPU time (``CpuLimitExceeded``); time spent
    waiting for the CPU, at the helper's low priority, does not count.
    Awaited on the running loop, holding no thread while it waits (on a busy
    machine a helper may wait long)."""
    loop = asyncio.get_running_loop()
    for attempt in (1, 2):
        pool = _current_pool()
        try:
            # submit may start a process: not on the loop
            future = await loop.run_in_executor(None, pool.submit, _limited, cpu_seconds, fn, *args)
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            _forget(pool)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _limited(cpu_seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """In the helper: ``fn(*args)`` under a timer on this process's CPU time."""

    def interrupt(signum: int, frame: Any) -> None:
        raise CpuLimitExceeded(f"over {cpu_seconds:g} s of CPU time")

    previous = signal.signal(signal.SIGVTALRM, interrupt)
    signal.setitimer(signal.ITIMER_VIRTUAL, cpu_seconds)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


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
