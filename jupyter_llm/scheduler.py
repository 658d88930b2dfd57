"""The model scheduler: which runners are loaded where, who is using them, and
when they go away (BEHAVIOUR.md, Scheduler and Memory).

Runs on the server's asyncio loop. Its collaborators are injected: the runner
factory, the device source, and the GGUF reader, so tests drive every policy
with fake runners and simulated devices. The policy decisions themselves
(layout, eviction victim, reload) are plain functions.

It only schedules: how a placement becomes a runner's launch (visible devices,
tensor split) is ``runner.launch``; what llama.cpp really allocated is
``memory.measured``; the ``/api/ps`` shape is ``api.ps``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from jupyter_llm.config import Settings
from jupyter_llm.devices import (
    DeviceInfo,
    DeviceSource,
    device_from_raw,
    gpu_max_tensor,
    node_devices,
    nodes_by_free,
    on_node,
    serving_gpus,
)
from jupyter_llm.errors import (
    AllocationFailed,
    InsufficientMemory,
    ModelLoadFailed,
    ModelUnloaded,
    RunnerFailed,
    ServerBusy,
)
from jupyter_llm.fair_queue import FairQueue, Waiter, unload_now
from jupyter_llm.identity import LOCAL, Requester
from jupyter_llm.memory import (
    CPU,
    Allocation,
    Estimate,
    EstimateOptions,
    GpuSlot,
    LayoutFailure,
    ModelInfo,
    Placement,
    estimate,
    plan_layout,
)
from jupyter_llm.memory.measured import backend_names, measured_allocations
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.memory.projector import ProjectorInfo, read_projector_info
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.runner.launch import LoadRequest, gpu_library
from jupyter_llm.runner.progress import reporting_load_progress

log = logging.getLogger(__name__)

VRAM_RECOVERY_POLL = 0.25
VRAM_RECOVERY_TIMEOUT = 5.0
VRAM_RECOVERY_SHARE = 0.75
MAX_BACKOFF_STEPS = 9  # new estimates: 10 %, 20 %, ... 90 % less free memory


class Runner(Protocol):
    """What the scheduler needs of a loaded runner (``runner.proxy.RunnerProxy``)."""

    load_duration_ns: int

    @property
    def alive(self) -> bool: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_seq(self) -> int: ...  # sequences it decodes at once: the model's slots
    @property
    def measured(self) -> dict[str, dict[str, int]]: ...
    def complete(self, **request: Any) -> AsyncIterator[list[dict[str, Any]]]: ...
    async def embed(self, **request: Any) -> dict[str, Any]: ...
    async def health(self, timeout: float = 5.0) -> bool: ...
    async def device_info(self) -> list[dict[str, Any]]: ...
    # ``reason``: what the requests still running end with (default: the runner's exit)
    async def close(self, reason: RunnerFailed | None = None) -> None: ...
    def kill(self) -> None: ...


# Starts a runner and loads the model into it; raises ``ModelLoadFailed``
# (``AllocationFailed`` when llama.cpp could not get the memory).
RunnerFactory = Callable[[LoadRequest], Awaitable[Runner]]


@dataclass(frozen=True)
class LoadOptions:
    """Load-time options of one request (None: the server's default)."""

    num_ctx: int | None = None
    num_batch: int | None = None
    num_thread: int | None = None
    use_mmap: bool | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None


@dataclass(frozen=True)
class Wanted:
    """Load options resolved against the settings and the model."""

    num_ctx: int
    num_batch: int
    num_thread: int
    use_mmap: bool
    num_gpu: int
    main_gpu: int


@dataclass
class Loaded:
    """A loaded model and its bookkeeping."""

    entry: ModelEntry
    runner: Runner
    wanted: Wanted
    placement: Placement
    allocations: tuple[Allocation, ...]
    measured: bool
    keep_alive: float
    parallel: int = 1  # requests it serves at once (the number of slots)
    refcount: int = 0  # slots taken (requests running on it)
    users: Counter[str] = field(default_factory=Counter)  # running requests per user
    node: str = ""  # the cluster node it runs on ("": this machine)
    waiting: int = 0
    drainers: int = 0  # loads waiting (without the load lock) for its requests to end
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # wall clock, while idle
    timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> str:
        return self.entry.name.display

    @property
    def draining(self) -> bool:
        """An eviction or reload waits for it: new requests wait too, so the
        drain ends."""
        return self.drainers > 0


class MustDrain(Exception):
    """The plan needs ``victim`` gone, but it is busy: wait without the load
    lock until its requests end, then plan again."""

    def __init__(self, victim: Loaded) -> None:
        super().__init__(victim.key)
        self.victim = victim


class Unloaded(Exception):
    """The model a request was queued on went away (an admin's unload, an
    eviction, a dead runner) before a slot came: it goes back to loading."""


class Lease:
    """A request's hold on a loaded runner; released however the request ends."""

    def __init__(
        self, scheduler: Scheduler, loaded: Loaded, load_duration_ns: int, user: str
    ) -> None:
        self._scheduler = scheduler
        self.loaded = loaded
        self.user = user
        self.runner = loaded.runner
        self.load_duration_ns = load_duration_ns
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._scheduler._release(self.loaded, self.user)


# -- pure policy -----------------------------------------------------------------------
def choose_victim(loaded: list[Loaded]) -> Loaded | None:
    """Idle runners first; then the shortest keep_alive, then least recently used.
    With none idle, the best busy one (the caller waits for it to drain)."""
    if not loaded:
        return None
    idle = [m for m in loaded if m.refcount == 0]
    return min(idle or loaded, key=lambda m: (m.keep_alive, m.last_used))


def needs_reload(loaded: Loaded, entry: ModelEntry, wanted: Wanted) -> bool:
    """A different file, or a load-time option that differs. A smaller or equal
    num_ctx reuses the runner; num_gpu -1 accepts any layout."""
    have = loaded.wanted
    return (
        loaded.entry.digest != entry.digest
        or wanted.num_ctx > have.num_ctx
        or wanted.num_batch != have.num_batch
        or wanted.num_thread != have.num_thread
        or wanted.use_mmap != have.use_mmap
        or wanted.main_gpu != have.main_gpu
        or (wanted.num_gpu != -1 and wanted.num_gpu != have.num_gpu)
    )


def eviction_node(
    devices: list[DeviceInfo], loaded: list[Loaded], fits: Callable[[str], bool]
) -> str:
    """Where to make room when the model fits on no node as things are: the
    first node (most free memory first) where it would fit with that node's
    models gone (``fits``), else the first node with a model at all. Evicting
    only there, a model on one node never goes to make room on another."""
    busy = [n for n in nodes_by_free(devices) if any(m.node == n for m in loaded)]
    return next((n for n in busy if fits(n)), busy[0] if busy else "")


def max_loaded(settings: Settings, gpu_count: int) -> int:
    return settings.max_loaded_models or max(3, 3 * gpu_count)


# -- the scheduler ---------------------------------------------------------------------
class Scheduler:
    def __init__(
        self,
        settings: Settings,
        start_runner: RunnerFactory,
        devices: DeviceSource,
        read_info: Callable[[Path], ModelInfo] = read_model_info,
        read_projector: Callable[[Path], ProjectorInfo] = read_projector_info,
    ) -> None:
        self.settings = settings
        self.devices = devices
        self._start_runner = start_runner
        self._read_info = read_info
        self._read_projector = read_projector
        self._infos: dict[Path, ModelInfo] = {}
        self._projectors: dict[Path, ProjectorInfo] = {}
        self._loaded: dict[str, Loaded] = {}
        self._load_lock = asyncio.Lock()
        self._waiting = 0
        self._changed = asyncio.Condition()
        self._closing = False
        self._background: set[asyncio.Future[None]] = set()
        self._loading: dict[str, float] = {}  # model -> load progress, while it loads
        # slots are handed out fairly across users (fair_queue.py)
        self._fair = FairQueue()
        self._grants: dict[Waiter, tuple[asyncio.Future[None], Loaded]] = {}
        self._active: Counter[str] = Counter()  # running requests per user, all models

    # -- public --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(
        self,
        entry: ModelEntry,
        options: LoadOptions,
        keep_alive: float | None,
        requester: Requester = LOCAL,
    ) -> AsyncIterator[Lease]:
        lease = await self.acquire(entry, options, keep_alive, requester)
        try:
            yield lease
        finally:
            lease.release()

    async def acquire(
        self,
        entry: ModelEntry,
        options: LoadOptions,
        keep_alive: float | None,
        requester: Requester = LOCAL,
    ) -> Lease:
        """A runner for ``entry`` with a free slot, loading it if needed. Waiting
        here (for a load or a slot) counts against ``max_queue``; free slots go
        to the waiting users in turn (``fair_queue``)."""
        if self._waiting >= self.settings.max_queue:
            raise ServerBusy()
        self._waiting += 1
        try:
            while True:
                loaded, fresh_ns = await self._get_loaded(entry, options, keep_alive)
                loaded.waiting += 1
                try:
                    await self._take_slot(loaded, requester.name)
                    break
                except Unloaded:
                    continue  # load it again (or fail with the reason it cannot load)
                finally:
                    loaded.waiting -= 1
        finally:
            self._waiting -= 1
        loaded.last_used = time.monotonic()
        self._stop_timer(loaded)
        if keep_alive is not None:
            loaded.keep_alive = keep_alive
        return Lease(self, loaded, fresh_ns, requester.name)

    async def _take_slot(self, loaded: Loaded, user: str) -> None:
        """Wait in ``user``'s queue until ``_dispatch`` gives this request a slot."""
        waiter = self._fair.push(user, loaded.key)
        granted = asyncio.get_running_loop().create_future()
        self._grants[waiter] = (granted, loaded)
        self._dispatch()
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._release(loaded, user)  # granted as it was cancelled
            else:
                self._fair.remove(waiter)
                self._grants.pop(waiter, None)
            raise

    def _dispatch(self) -> None:
        """Hand every free slot to the next waiter the fair queue picks."""

        def has_slot(waiter: Waiter) -> bool:
            loaded = self._grants[waiter][1]
            return loaded.runner.alive and loaded.refcount < loaded.parallel

        limit = self.settings.max_requests_per_user
        while (waiter := self._fair.pop(self._active, limit, has_slot)) is not None:
            granted, loaded = self._grants.pop(waiter)
            loaded.refcount += 1
            loaded.users[waiter.user] += 1
            self._active[waiter.user] += 1
            granted.set_result(None)

    def _requeue(self, loaded: Loaded) -> None:
        """``loaded`` is gone: the requests queued on it go back to loading."""
        for waiter, (granted, on) in list(self._grants.items()):
            if on is loaded:
                del self._grants[waiter]
                self._fair.remove(waiter)
                if not granted.done():
                    granted.set_exception(Unloaded(loaded.key))

    def holders(self, loaded: Loaded) -> list[dict[str, Any]]:
        """Who holds ``loaded``: each user with requests running or queued on it."""
        queued = self._fair.queued(loaded.key) if self._loaded.get(loaded.key) is loaded else {}
        names = sorted({*(u for u, n in loaded.users.items() if n), *queued})
        return [
            {"name": u, "running": loaded.users.get(u, 0), "queued": queued.get(u, 0)}
            for u in names
        ]

    @property
    def pending(self) -> int:
        """Requests waiting for a load or a slot (bounded by ``max_queue``)."""
        return self._waiting

    def loaded_models(self) -> list[Loaded]:
        return [m for m in self._loaded.values() if m.runner.alive]

    async def unload(self, name: str, requester: Requester = LOCAL) -> bool:
        """Unload now if idle, or as soon as its requests end. Another user's
        running requests only an admin may cut off (``fair_queue.unload_now``);
        anyone else's unload waits until the model is idle."""
        loaded = self._loaded.get(name)
        if loaded is None:
            return False
        loaded.keep_alive = 0
        if unload_now(loaded.users, requester.name, requester.admin):
            async with self._load_lock:
                if self._loaded.get(name) is loaded and unload_now(
                    loaded.users, requester.name, requester.admin
                ):
                    reason = None
                    if loaded.refcount:  # others' requests: they end saying why
                        log.info("%s unloads %s in use by others", requester.name, name)
                        reason = ModelUnloaded(loaded.key)
                    await self._unload(loaded, reason)
        return True

    async def shutdown(self) -> None:
        self._closing = True
        for loaded in list(self._loaded.values()):
            self._stop_timer(loaded)
            loaded.runner.kill()
            self._requeue(loaded)  # they fail: nothing loads while shutting down
        await asyncio.gather(
            *(m.runner.close() for m in self._loaded.values()), return_exceptions=True
        )
        self._loaded.clear()

    def kill_all(self) -> None:
        """Last resort, synchronous: no runner outlives the server."""
        for loaded in self._loaded.values():
            loaded.runner.kill()

    async def current_devices(self) -> list[DeviceInfo]:
        """Devices with free memory as of now; a loaded runner is asked first."""
        used: dict[str, int] = {}
        for m in self.loaded_models():
            for a in m.allocations:
                key = on_node(m.node, a.device)  # a node's own "cpu", and its GPUs
                used[key] = used.get(key, 0) + a.total
        fresh = None
        if runner := next((m.runner for m in self.loaded_models()), None):

            async def fresh() -> list[DeviceInfo]:
                return [device_from_raw(raw) for raw in await runner.device_info()]

        return await self.devices.devices(used=used, fresh=fresh)

    # -- loading -------------------------------------------------------------------
    def _wanted(self, options: LoadOptions, info: ModelInfo) -> Wanted:
        num_ctx = options.num_ctx or self.settings.context_length
        if info.context_length:
            num_ctx = min(num_ctx, info.context_length)
        return Wanted(
            num_ctx=num_ctx,
            num_batch=min(options.num_batch or 512, num_ctx),
            num_thread=options.num_thread or self.settings.num_threads,
            use_mmap=True if options.use_mmap is None else options.use_mmap,
            num_gpu=-1 if options.num_gpu is None else options.num_gpu,
            main_gpu=options.main_gpu or 0,
        )

    async def _get_loaded(
        self, entry: ModelEntry, options: LoadOptions, keep_alive: float | None
    ) -> tuple[Loaded, int]:
        """A loaded runner for ``entry``. Loads hold the load lock (one at a
        time); waiting for a busy model to drain never does, so requests,
        unloads and expiries of other models go on meanwhile."""
        info = await self._model_info(entry.model_path)
        wanted = self._wanted(options, info)
        key = entry.name.display
        victim: Loaded | None = None  # marked draining by this request
        try:
            while True:
                current = self._loaded.get(key)
                if current is not None and current.draining and current is not victim:
                    await self._until(
                        lambda c=current: self._loaded.get(key) is not c or not c.draining
                    )
                    continue
                if current and await self._reusable(current, entry, wanted):
                    return current, 0
                async with self._load_lock:
                    if victim is not None:  # plan afresh: it may not be needed now
                        victim.drainers -= 1
                        victim = None
                        await self._notify()
                    current = self._loaded.get(key)
                    if current is not None and current.draining:
                        continue  # another load drains it: wait above, without the lock
                    if current and await self._reusable(current, entry, wanted):
                        return current, 0
                    try:
                        if current is not None:
                            await self._evict(current)
                        loaded = await self._load(entry, info, wanted, keep_alive)
                    except MustDrain as busy:
                        victim = busy.victim
                        victim.drainers += 1
                    else:
                        self._loaded[key] = loaded
                        return loaded, loaded.runner.load_duration_ns
                await self._until(lambda v=victim: self._drained(v))
        finally:
            if victim is not None:  # cancelled (the client left) or failed while waiting
                victim.drainers -= 1
                self._spawn(self._notify())

    async def _model_info(self, path: Path) -> ModelInfo:
        """GGUF facts, parsed once per file (blobs are content-addressed)."""
        return await self._cached(self._infos, self._read_info, path)

    async def _projector_info(self, path: Path | None) -> ProjectorInfo | None:
        if path is None:
            return None
        return await self._cached(self._projectors, self._read_projector, path)

    @staticmethod
    async def _cached(cache: dict[Path, Any], read: Callable[[Path], Any], path: Path) -> Any:
        if (info := cache.get(path)) is None:
            loop = asyncio.get_running_loop()
            info = await loop.run_in_executor(None, read, path)
            if len(cache) >= 256:
                cache.clear()
            cache[path] = info
        return info

    async def _reusable(self, loaded: Loaded, entry: ModelEntry, wanted: Wanted) -> bool:
        if not loaded.runner.alive or needs_reload(loaded, entry, wanted):
            return False
        if loaded.refcount == 0 and not await loaded.runner.health(timeout=5.0):
            log.warning("%s did not answer its health check: reloading", loaded.key)
            return False
        return True

    async def _load(
        self, entry: ModelEntry, info: ModelInfo, wanted: Wanted, keep_alive: float | None
    ) -> Loaded:
        """The fit loop: place, evicting others while that is what it takes."""
        parallel = 1 if info.embedding_only else self.settings.num_parallel
        projector = await self._projector_info(entry.projector_path)
        opts = EstimateOptions(num_ctx=wanted.num_ctx, num_batch=wanted.num_batch)
        backoff = 0
        while True:
            if self._closing:
                raise ModelLoadFailed("the server is shutting down")
            devices = await self.current_devices()
            # what the serving GPUs' backend refuses stays on the CPU
            limit = gpu_max_tensor(serving_gpus(devices))
            est = estimate(info, replace(opts, gpu_max_tensor=limit), projector)
            if await self._make_room_for_count(devices):
                continue  # something was unloaded: look at the devices again
            try:
                node, placement = self._place(est, wanted, devices, backoff)
            except LayoutFailure as failure:
                # one node's models make room on that node only
                where = eviction_node(
                    devices,
                    self.loaded_models(),
                    lambda n, d=devices, e=est: self._fits_emptied(e, wanted, d, n),
                )
                if others := [m for m in self.loaded_models() if m.node == where]:
                    await self._evict(choose_victim(others))
                    continue
                raise InsufficientMemory(str(failure)) from None
            request = self._load_request(
                entry, wanted, parallel, placement, node_devices(devices, node), node
            )
            log.info(
                "loading %s: %d/%d layers on %s, num_ctx %d",
                entry.name.display, placement.n_gpu_layers, placement.n_layers,
                ", ".join(placement.gpus) or on_node(node, "cpu"), wanted.num_ctx,
            )  # fmt: skip
            try:
                runner = await self._start_tracked(entry.name.display, request)
            except AllocationFailed as e:
                if not self.settings.new_estimates:
                    raise
                if placement.n_gpu_layers == 0 or backoff >= MAX_BACKOFF_STEPS:
                    raise InsufficientMemory(f"memory layout cannot be allocated: {e}") from e
                backoff += 1
                log.info("allocation failed, retrying with %d %% less free memory", 10 * backoff)
                continue
            return self._loaded_record(entry, runner, wanted, request, keep_alive)

    def _place(
        self, est: Estimate, wanted: Wanted, devices: list[DeviceInfo], backoff: int
    ) -> tuple[str, Placement]:
        """The first node (most free memory first) with a layout; one model
        never spans nodes. Raises the first node's ``LayoutFailure``."""
        first: LayoutFailure | None = None
        for node in nodes_by_free(devices):
            others = any(m.node == node for m in self.loaded_models())
            try:
                return node, self._plan(est, wanted, node_devices(devices, node), backoff, others)
            except LayoutFailure as failure:
                first = first or failure
        raise first or LayoutFailure("no node to place the model on")

    def _plan(
        self, est: Estimate, wanted: Wanted, devices: list[DeviceInfo], backoff: int, others: bool
    ) -> Placement:
        """The layout on one node's devices; with other models there, all on GPUs."""
        return plan_layout(
            est,
            self._gpu_slots(devices, backoff),
            next(d.free_memory for d in devices if not d.is_gpu),
            num_gpu=wanted.num_gpu,
            require_full=others,
            gpu_overhead=self.settings.gpu_overhead,
        )

    def _fits_emptied(
        self, est: Estimate, wanted: Wanted, devices: list[DeviceInfo], node: str
    ) -> bool:
        """Would the model fit on ``node`` with its models unloaded?"""
        held: dict[str, int] = {}
        for m in self.loaded_models():
            if m.node == node:
                for a in m.allocations:
                    key = on_node(node, a.device)
                    held[key] = held.get(key, 0) + a.total
        freed = [
            replace(d, free_memory=d.free_memory + held.get(on_node(node, d.id), 0))
            for d in node_devices(devices, node)
        ]
        try:
            self._plan(est, wanted, freed, 0, others=False)
        except LayoutFailure:
            return False
        return True

    # -- load progress -------------------------------------------------------------
    def loading_models(self) -> dict[str, float]:
        """The models whose runner is loading now, each with its progress (0..1)."""
        return dict(self._loading)

    async def _start_tracked(self, key: str, request: LoadRequest) -> Runner:
        """The runner factory, with the load's progress kept under ``key``."""
        self._loading[key] = 0.0

        def report(fraction: float) -> None:
            self._loading[key] = fraction

        try:
            with reporting_load_progress(report):
                return await self._start_runner(request)
        finally:
            self._loading.pop(key, None)

    def _loaded_record(
        self,
        entry: ModelEntry,
        runner: Runner,
        wanted: Wanted,
        request: LoadRequest,
        keep_alive: float | None,
    ) -> Loaded:
        placement = request.placement
        allocations, measured = placement.allocations, False
        if self.settings.new_estimates:
            names = backend_names(gpu_library(request) or "GPU", placement.gpus)
            if real := measured_allocations(placement, runner.measured, names):
                allocations, measured = real, True
        return Loaded(
            entry=entry,
            runner=runner,
            wanted=wanted,
            placement=placement,
            allocations=allocations,
            measured=measured,
            keep_alive=self.settings.keep_alive if keep_alive is None else keep_alive,
            parallel=runner.n_seq,
            node=request.node,
        )

    def _gpu_slots(self, devices: list[DeviceInfo], backoff: int) -> list[GpuSlot]:
        """The serving GPUs, free memory shrunk by the backoff."""
        keep = 1.0 - 0.1 * backoff
        return [
            GpuSlot(d.id, d.library, int(d.free_memory * keep), d.integrated)
            for d in serving_gpus(devices)
        ]

    def _load_request(
        self,
        entry: ModelEntry,
        wanted: Wanted,
        parallel: int,
        placement: Placement,
        devices: list[DeviceInfo],
        node: str = "",
    ) -> LoadRequest:
        return LoadRequest(
            path=str(entry.model_path),
            num_ctx=wanted.num_ctx,
            num_batch=wanted.num_batch,
            num_thread=wanted.num_thread,
            use_mmap=wanted.use_mmap,
            parallel=parallel,
            placement=placement,
            gpus=tuple(serving_gpus(devices)),
            simulated=self.devices.simulated,
            projector=str(entry.projector_path or ""),
            node=node,
        )

    # -- eviction --------------------------------------------------------------------
    async def _make_room_for_count(self, devices: list[DeviceInfo]) -> bool:
        """Drop dead runners and keep below max_loaded_models; True if it unloaded."""
        changed = False
        for dead in [m for m in self._loaded.values() if not m.runner.alive]:
            await self._unload(dead)
            changed = True
        gpus = sum(1 for d in devices if d.is_gpu)
        while len(self.loaded_models()) >= max_loaded(self.settings, gpus):
            await self._evict(choose_victim(self.loaded_models()))
            changed = True
        return changed

    async def _evict(self, victim: Loaded | None) -> None:
        """Unload ``victim`` now if it is idle (or dead); if it is busy, raise
        ``MustDrain`` so that the caller waits for it outside the load lock."""
        if victim is None:
            return
        if not self._drained(victim):
            raise MustDrain(victim)
        log.info("evicting %s to make room", victim.key)
        await self._unload(victim)

    def _drained(self, loaded: Loaded) -> bool:
        """No request holds it any more (or it is gone, or dead)."""
        return (
            loaded.refcount == 0
            or not loaded.runner.alive
            or self._loaded.get(loaded.key) is not loaded
        )

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds; it is checked whenever the
        scheduler's state changes (a release, an unload)."""
        async with self._changed:
            await self._changed.wait_for(condition)

    async def _unload(self, loaded: Loaded, reason: RunnerFailed | None = None) -> None:
        """Stop ``loaded``'s runner; requests still running on it end with
        ``reason`` (an admin's unload) or else the runner's own exit."""
        self._stop_timer(loaded)
        held = {a.device: a.total for a in loaded.allocations if a.device != CPU and a.total}
        before = {d.id: d.free_memory for d in await self.current_devices()} if held else {}
        if self._loaded.get(loaded.key) is loaded:
            del self._loaded[loaded.key]
        self._requeue(loaded)
        log.info("unloading %s", loaded.key)
        await (loaded.runner.close(reason) if reason else loaded.runner.close())
        await self._wait_for_vram_recovery(before, held)
        await self._notify()

    async def _wait_for_vram_recovery(self, before: dict[str, int], held: dict[str, int]) -> None:
        """After a GPU unload, free VRAM lags; wait until 75 % of it is back
        (polling 250 ms, at most 5 s) before the next placement. iGPU-only
        runners (shared memory) do not wait."""
        devices = {d.id: d for d in await self.current_devices()} if held else {}
        held = {d: n for d, n in held.items() if d in devices and not devices[d].integrated}
        deadline = time.monotonic() + VRAM_RECOVERY_TIMEOUT
        while held:
            now = {d.id: d.free_memory for d in await self.current_devices()}
            if all(
                now.get(d, 0) - before.get(d, 0) >= VRAM_RECOVERY_SHARE * n for d, n in held.items()
            ):
                return
            if time.monotonic() >= deadline:
                log.info("free VRAM did not recover within %.0fs", VRAM_RECOVERY_TIMEOUT)
                return
            await asyncio.sleep(VRAM_RECOVERY_POLL)

    # -- release and keep_alive ------------------------------------------------------
    def _release(self, loaded: Loaded, user: str) -> None:
        loaded.refcount -= 1
        loaded.users[user] -= 1
        if loaded.users[user] <= 0:
            del loaded.users[user]
        self._active[user] -= 1
        if self._active[user] <= 0:
            del self._active[user]
        loaded.last_used = time.monotonic()
        if self._closing:
            return
        self._dispatch()
        if not loaded.runner.alive:
            if self._loaded.get(loaded.key) is loaded:
                del self._loaded[loaded.key]
            self._requeue(loaded)
            self._spawn(loaded.runner.close())
        elif loaded.refcount == 0:
            self._start_timer(loaded)
        self._spawn(self._notify())

    def _spawn(self, work: Awaitable[None]) -> None:
        """Background work that must not be garbage-collected mid-way."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _start_timer(self, loaded: Loaded) -> None:
        self._stop_timer(loaded)
        if math.isinf(loaded.keep_alive):
            return
        loop = asyncio.get_running_loop()
        loaded.expires_at = time.time() + loaded.keep_alive
        loaded.timer = loop.call_later(loaded.keep_alive, lambda: self._spawn(self._expire(loaded)))

    def _stop_timer(self, loaded: Loaded) -> None:
        if loaded.timer is not None:
            loaded.timer.cancel()
            loaded.timer = None
        loaded.expires_at = None

    async def _expire(self, loaded: Loaded) -> None:
        """The keep_alive timer fired; a request that arrived meanwhile wins."""
        async with self._load_lock:
            if (
                loaded.refcount == 0
                and loaded.waiting == 0
                and self._loaded.get(loaded.key) is loaded
            ):
                await self._unload(loaded)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
