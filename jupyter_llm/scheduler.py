"""The model scheduler: which runners are loaded, who is using them, and when
they go away. Runs on the server's asyncio loop; its collaborators (the runner
factory and the device source) are injected so tests can drive every policy.

This is the vertical slice's scheduler: one load at a time, a bounded queue,
refcounts, keep_alive timers, reuse when ``num_ctx`` fits, LRU eviction of idle
runners at ``max_loaded_models``, and a fresh runner when one has died.
Placement across GPUs builds on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceSource
from jupyter_llm.errors import ServerBusy
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.runner.model import LoadSpec, ModelRunner

log = logging.getLogger(__name__)

RunnerFactory = Callable[[LoadSpec], Awaitable[ModelRunner]]


@dataclass
class LoadOptions:
    """Load-time options of one request (None: server default)."""

    num_ctx: int | None = None
    num_batch: int | None = None
    num_thread: int | None = None
    use_mmap: bool | None = None


@dataclass
class Loaded:
    """A loaded model and its bookkeeping."""

    entry: ModelEntry
    runner: ModelRunner
    keep_alive: float
    slots: asyncio.Semaphore
    refcount: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # wall clock; None while in use or forever
    timer: asyncio.TimerHandle | None = None
    fresh_load_ns: int = 0  # load time to report to the request that caused it

    @property
    def key(self) -> str:
        return self.entry.name.display


class Lease:
    """A request's hold on a loaded runner; released however the request ends."""

    def __init__(self, scheduler: Scheduler, loaded: Loaded, load_duration_ns: int) -> None:
        self._scheduler = scheduler
        self.loaded = loaded
        self.runner = loaded.runner
        self.load_duration_ns = load_duration_ns
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._scheduler._release(self.loaded)


class Scheduler:
    def __init__(self, settings: Settings, start_runner: RunnerFactory, devices: DeviceSource):
        self.settings = settings
        self._start_runner = start_runner
        self.devices = devices
        self._loaded: dict[str, Loaded] = {}
        self._load_lock = asyncio.Lock()
        self._waiting = 0
        self._changed = asyncio.Condition()
        self._closing = False

    # -- public --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(
        self, entry: ModelEntry, options: LoadOptions, keep_alive: float | None
    ) -> AsyncIterator[Lease]:
        lease = await self.acquire(entry, options, keep_alive)
        try:
            yield lease
        finally:
            lease.release()

    async def acquire(
        self, entry: ModelEntry, options: LoadOptions, keep_alive: float | None
    ) -> Lease:
        """A runner for ``entry`` with a free slot, loading it if needed."""
        if self._waiting >= self.settings.max_queue:
            raise ServerBusy()
        self._waiting += 1
        try:
            loaded, fresh_ns = await self._get_loaded(entry, options, keep_alive)
            await loaded.slots.acquire()
        finally:
            self._waiting -= 1
        loaded.refcount += 1
        loaded.last_used = time.monotonic()
        self._stop_timer(loaded)
        if keep_alive is not None:
            loaded.keep_alive = keep_alive
        return Lease(self, loaded, fresh_ns)

    def loaded_models(self) -> list[Loaded]:
        return [m for m in self._loaded.values() if m.runner.alive]

    def max_loaded(self, gpu_count: int) -> int:
        configured = self.settings.max_loaded_models
        return configured if configured > 0 else max(3, 3 * gpu_count)

    async def unload(self, name: str) -> bool:
        """Unload now if idle, or as soon as its requests end."""
        loaded = self._loaded.get(name)
        if loaded is None:
            return False
        loaded.keep_alive = 0
        if loaded.refcount == 0:
            await self._unload(loaded)
        return True

    async def shutdown(self) -> None:
        self._closing = True
        for loaded in list(self._loaded.values()):
            self._stop_timer(loaded)
            loaded.runner.kill()
        await asyncio.gather(
            *(m.runner.close() for m in self._loaded.values()), return_exceptions=True
        )
        self._loaded.clear()

    def kill_all(self) -> None:
        """Last resort, synchronous: no runner outlives the server."""
        for loaded in self._loaded.values():
            loaded.runner.kill()

    # -- loading -------------------------------------------------------------------
    async def _get_loaded(
        self, entry: ModelEntry, options: LoadOptions, keep_alive: float | None
    ) -> tuple[Loaded, int]:
        spec = self._spec(entry, options)
        key = entry.name.display
        current = self._loaded.get(key)
        if current and self._reusable(current, entry, spec):
            return current, 0
        async with self._load_lock:
            current = self._loaded.get(key)
            if current and self._reusable(current, entry, spec):
                return current, 0
            if current is not None:
                await self._drain_and_unload(current)
            await self._make_room()
            log.info("loading %s (num_ctx %d)", key, spec.n_ctx)
            runner = await self._start_runner(spec)
            loaded = Loaded(
                entry=entry,
                runner=runner,
                keep_alive=self.settings.keep_alive if keep_alive is None else keep_alive,
                slots=asyncio.Semaphore(self.settings.num_parallel),
            )
            self._loaded[key] = loaded
            return loaded, runner.load_duration_ns

    def _spec(self, entry: ModelEntry, options: LoadOptions) -> LoadSpec:
        n_ctx = options.num_ctx or self.settings.context_length
        n_batch = min(options.num_batch or 512, n_ctx)
        return LoadSpec(
            path=str(entry.model_path),
            n_ctx=n_ctx * self.settings.num_parallel,
            n_batch=n_batch,
            n_threads=options.num_thread or self.settings.num_threads,
            use_mmap=True if options.use_mmap is None else options.use_mmap,
        )

    @staticmethod
    def _reusable(loaded: Loaded, entry: ModelEntry, spec: LoadSpec) -> bool:
        """Same model file, alive, and a context at least as large as asked for."""
        have = loaded.runner.spec
        return (
            loaded.runner.alive
            and loaded.entry.digest == entry.digest
            and have.path == spec.path
            and spec.n_ctx <= have.n_ctx
            and spec.n_batch == have.n_batch
            and spec.n_threads == have.n_threads
            and spec.use_mmap == have.use_mmap
        )

    async def _make_room(self) -> None:
        """Evict idle runners (LRU) until a new one may be loaded."""
        gpus = [d for d in await self.devices.devices() if d.is_gpu]
        limit = self.max_loaded(len(gpus))
        while len(self.loaded_models()) >= limit:
            idle = [m for m in self._loaded.values() if m.refcount == 0]
            if idle:
                victim = min(idle, key=lambda m: (m.keep_alive, m.last_used))
                await self._unload(victim)
                continue
            async with self._changed:
                await self._changed.wait()
        for dead in [m for m in self._loaded.values() if not m.runner.alive]:
            await self._unload(dead)

    async def _drain_and_unload(self, loaded: Loaded) -> None:
        while loaded.refcount > 0 and loaded.runner.alive:
            async with self._changed:
                await self._changed.wait()
        await self._unload(loaded)

    async def _unload(self, loaded: Loaded) -> None:
        self._stop_timer(loaded)
        if self._loaded.get(loaded.key) is loaded:
            del self._loaded[loaded.key]
        log.info("unloading %s", loaded.key)
        await loaded.runner.close()
        await self._notify()

    # -- release and keep_alive ------------------------------------------------------
    def _release(self, loaded: Loaded) -> None:
        loaded.refcount -= 1
        loaded.slots.release()
        loaded.last_used = time.monotonic()
        if self._closing:
            return
        if not loaded.runner.alive:
            if self._loaded.get(loaded.key) is loaded:
                del self._loaded[loaded.key]
            asyncio.get_running_loop().create_task(loaded.runner.close())
        elif loaded.refcount == 0:
            self._start_timer(loaded)
        asyncio.get_running_loop().create_task(self._notify())

    def _start_timer(self, loaded: Loaded) -> None:
        self._stop_timer(loaded)
        if math.isinf(loaded.keep_alive):
            return
        loop = asyncio.get_running_loop()
        loaded.expires_at = time.time() + loaded.keep_alive
        loaded.timer = loop.call_later(
            loaded.keep_alive, lambda: loop.create_task(self._expire(loaded))
        )

    def _stop_timer(self, loaded: Loaded) -> None:
        if loaded.timer is not None:
            loaded.timer.cancel()
            loaded.timer = None
        loaded.expires_at = None

    async def _expire(self, loaded: Loaded) -> None:
        if loaded.refcount == 0 and self._loaded.get(loaded.key) is loaded:
            async with self._load_lock:
                if loaded.refcount == 0 and self._loaded.get(loaded.key) is loaded:
                    await self._unload(loaded)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def describe(self, loaded: Loaded) -> dict[str, Any]:
        """The /api/ps view of one loaded model."""
        entry = loaded.entry
        expires = loaded.expires_at
        if expires is None and not math.isinf(loaded.keep_alive):
            expires = time.time() + loaded.keep_alive
        return {
            "name": entry.name.display,
            "model": entry.name.display,
            "size": entry.size,
            "size_vram": 0,
            "digest": entry.digest,
            "details": entry.details,
            "expires_at": _iso(expires) if expires is not None else "2318-01-01T00:00:00Z",
            "context_length": loaded.runner.n_ctx // max(1, self.settings.num_parallel),
            "pid": loaded.runner.pid,
        }


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
