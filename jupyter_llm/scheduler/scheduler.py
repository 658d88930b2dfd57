"""The scheduler's state machine: which runners are loaded where, who is
using them, and when they go away (BEHAVIOUR.md, Scheduler and Memory).

Runs on the server's asyncio loop. Its collaborators are injected: the runner
factory, the device source, and the GGUF reader, so tests drive every policy
with fake runners and simulated devices. Its decisions are the plain
functions of ``policy``; slot grants, keep_alive timers, the VRAM wait, load
progress and the GGUF facts are each their own module here.

It only schedules: how a placement becomes a runner's launch (visible devices,
tensor split) is ``runner_client.launch``; what llama.cpp really allocated is
``memory.measured``; the ``/api/ps`` shape is ``api.ps``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceInfo, DeviceSource, device_from_raw, node_devices, on_node
from jupyter_llm.memory import LayoutFailure, ModelInfo
from jupyter_llm.memory.kv_cache import asked_cache
from jupyter_llm.memory.measured import backend_names, measured_allocations
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.memory.projector import ProjectorInfo, read_projector_info
from jupyter_llm.metrics import instruments as metrics
from jupyter_llm.metrics import watch
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.request.errors import (
    AllocationFailed,
    InsufficientMemory,
    ModelLoadFailed,
    ModelUnloaded,
    RunnerFailed,
    ServerBusy,
)
from jupyter_llm.request.identity import LOCAL, Requester
from jupyter_llm.request.priority import INTERACTIVE
from jupyter_llm.runner_client.launch import LoadRequest, gpu_library
from jupyter_llm.scheduler import fit, policy
from jupyter_llm.scheduler.fair_queue import Waiter, may_wait, unload_now
from jupyter_llm.scheduler.keep_alive import start_timer, stop_timer
from jupyter_llm.scheduler.load_progress import LoadProgress
from jupyter_llm.scheduler.model_facts import ModelFacts
from jupyter_llm.scheduler.slots import SlotGrants
from jupyter_llm.scheduler.types import (
    Lease,
    Loaded,
    LoadOptions,
    MustDrain,
    Request,
    Runner,
    RunnerFactory,
    Unloaded,
    Wanted,
)
from jupyter_llm.scheduler.vram import wait_for_vram_recovery

log = logging.getLogger(__name__)


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
        self._facts = ModelFacts(read_info, read_projector)
        self._loaded: dict[str, Loaded] = {}
        self._load_lock = asyncio.Lock()
        self._waiting: Counter[str] = Counter()  # requests waiting, per user
        self._changed = asyncio.Condition()
        self._closing = False
        self._background: set[asyncio.Future[None]] = set()
        self._progress = LoadProgress()
        self._slots = SlotGrants(settings.max_requests_per_user)
        watch(self)  # its queue, slots and memory in every Prometheus scrape

    # -- requests ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(
        self,
        entry: ModelEntry,
        options: LoadOptions,
        keep_alive: float | None,
        requester: Requester = LOCAL,
        priority: str = INTERACTIVE,
    ) -> AsyncIterator[Lease]:
        lease = await self.acquire(entry, options, keep_alive, requester, priority)
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
        priority: str = INTERACTIVE,
    ) -> Lease:
        """A runner for ``entry`` with a free slot, loading it if needed. Waiting
        here (for a load or a slot) counts against ``max_queue``; free slots go
        to the waiting users in turn (``fair_queue``), interactive requests
        before batch ones (``priority``)."""
        user = requester.name
        if not may_wait(self.pending, self._waiting[user], self.settings.max_queue):
            raise ServerBusy()
        self._waiting[user] += 1
        try:
            while True:
                loaded, fresh_ns = await self._get_loaded(entry, options, keep_alive)
                loaded.waiting += 1
                try:
                    waiter = await self._take_slot(loaded, requester.name, priority)
                    break
                except Unloaded:
                    continue  # load it again (or fail with the reason it cannot load)
                finally:
                    loaded.waiting -= 1
        finally:
            self._waiting[user] -= 1
            if not self._waiting[user]:
                del self._waiting[user]
        loaded.last_used = time.monotonic()
        stop_timer(loaded)
        if keep_alive is not None:
            loaded.keep_alive = keep_alive
        release = partial(self._release, waiter=waiter)
        return Lease(loaded, fresh_ns, requester.name, release, priority)

    async def _take_slot(self, loaded: Loaded, user: str, priority: str) -> Waiter:
        """Wait in ``user``'s queue until this request has a slot on ``loaded``."""
        waiter, granted = self._slots.request(loaded, user, priority)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._release(loaded, user, priority, waiter)  # granted as it was cancelled
            else:
                self._slots.withdraw(waiter)
            raise
        return waiter

    def _release(
        self, loaded: Loaded, user: str, priority: str = INTERACTIVE, waiter: Waiter | None = None
    ) -> None:
        self._slots.give_back(loaded, user, priority, waiter)
        loaded.last_used = time.monotonic()
        loaded.allocations = policy.held_allocations(loaded)  # what it made since its load
        if self._closing:
            return
        self._slots.dispatch()
        if not loaded.runner.alive:
            self._forget(loaded)
            self._spawn(loaded.runner.close())
        elif loaded.refcount == 0:
            start_timer(loaded, self._timer_fired)
        self._spawn(self._notify())

    # -- what the server shows -----------------------------------------------------
    @property
    def pending(self) -> int:
        """Requests waiting for a load or a slot (bounded by ``max_queue``)."""
        return self._waiting.total()

    def loaded_models(self) -> list[Loaded]:
        return [m for m in self._loaded.values() if m.runner.alive]

    def loading_models(self) -> dict[str, float]:
        """The models whose runner is loading now, each with its progress (0..1)."""
        return self._progress.loading()

    def queued(self, loaded: Loaded) -> dict[str, int]:
        """How many requests each user has waiting for a slot on ``loaded``."""
        if self._loaded.get(loaded.key) is not loaded:
            return {}
        return self._slots.queued(loaded.key)

    def queued_by_priority(self, loaded: Loaded) -> dict[str, dict[str, int]]:
        """Per user, how many requests of each priority wait for a slot on ``loaded``."""
        if self._loaded.get(loaded.key) is not loaded:
            return {}
        return self._slots.queued_by_priority(loaded.key)

    def requests(self, loaded: Loaded) -> list[Request]:
        """Each request running or queued on ``loaded`` (``SlotGrants.requests``)."""
        if self._loaded.get(loaded.key) is not loaded:
            return []
        return self._slots.requests(loaded)

    async def current_devices(self) -> list[DeviceInfo]:
        """Devices with free memory as of now; a loaded runner is asked first."""
        used = policy.held_bytes(self.loaded_models())
        fresh = None
        if runner := next((m.runner for m in self.loaded_models()), None):

            async def fresh() -> list[DeviceInfo]:
                return [device_from_raw(raw) for raw in await runner.device_info()]

        return await self.devices.devices(used=used, fresh=fresh)

    async def model_info(self, entry: ModelEntry) -> ModelInfo:
        """``entry``'s GGUF facts, read off the loop once per file."""
        return await self._facts.model(entry.model_path)

    async def plan(self, entry: ModelEntry, options: LoadOptions) -> fit.LoadPlan:
        """What a request for ``entry`` would do now, doing none of it: the fit
        loop's own decisions (``fit.next_move``) over a copy of the state. The
        GGUF is read off the loop, and no lock is taken, so a load in progress
        delays no plan (a plan made meanwhile sees the models loaded so far)."""
        info = await self.model_info(entry)
        wanted = policy.wanted(options, info, self.settings)
        devices = await self.current_devices()
        loaded = self.loaded_models()
        current = next((m for m in loaded if m.key == entry.name.display), None)
        if current is not None and not policy.needs_reload(current, entry, wanted):
            return fit.reuse_plan(current, devices)
        projector = await self._facts.projector(entry.projector_path)
        draft = await self._facts.draft(entry.draft_path)
        parallel = policy.parallel_slots(info, self.settings)
        est = fit.estimate_on(info, wanted, devices, projector, draft, parallel=parallel)
        plan = fit.plan_load(est, wanted, parallel, devices, loaded, self.settings, current)
        if plan.placement is None:
            return plan
        placed = policy.invariant_where_placed(wanted, plan.placement, self.devices.simulated)
        return replace(plan, wanted=placed)  # as /api/ps will say once it is loaded

    # -- unloading -----------------------------------------------------------------
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
            stop_timer(loaded)
            loaded.runner.kill()
            self._slots.fail_queued(loaded)  # they fail: nothing loads while shutting down
        await asyncio.gather(
            *(m.runner.close() for m in self._loaded.values()), return_exceptions=True
        )
        self._loaded.clear()

    def kill_all(self) -> None:
        """Last resort, synchronous: no runner outlives the server."""
        for loaded in self._loaded.values():
            loaded.runner.kill()

    def _forget(self, loaded: Loaded) -> None:
        """``loaded`` is gone: drop it (unless replaced already), and the
        requests queued on it go back to loading."""
        if self._loaded.get(loaded.key) is loaded:
            del self._loaded[loaded.key]
        self._slots.fail_queued(loaded)

    async def _unload(self, loaded: Loaded, reason: RunnerFailed | None = None) -> None:
        """Stop ``loaded``'s runner; requests still running on it end with
        ``reason`` (an admin's unload) or else the runner's own exit. After a
        GPU unload the next placement waits for the driver to show the VRAM.
        A runner found dead gives no baseline (the driver may have freed its
        VRAM already, and waiting for it to come back again waited out the
        whole timeout after every crash), nor does one stopped at shutdown."""
        stop_timer(loaded)
        held = policy.vram_held(loaded) if loaded.runner.alive and not self._closing else {}
        before = {d.id: d.free_memory for d in await self.current_devices()} if held else {}
        self._forget(loaded)
        log.info("unloading %s", loaded.key)
        await (loaded.runner.close(reason) if reason else loaded.runner.close())
        await wait_for_vram_recovery(self.current_devices, before, held)
        await self._notify()

    def _timer_fired(self, loaded: Loaded) -> None:
        self._spawn(self._expire(loaded))

    async def _expire(self, loaded: Loaded) -> None:
        """The keep_alive timer fired; a request that arrived meanwhile wins."""
        async with self._load_lock:
            if (
                loaded.refcount == 0
                and loaded.waiting == 0
                and self._loaded.get(loaded.key) is loaded
            ):
                await self._unload(loaded)

    # -- loading -------------------------------------------------------------------
    async def _get_loaded(
        self, entry: ModelEntry, options: LoadOptions, keep_alive: float | None
    ) -> tuple[Loaded, int]:
        """A loaded runner for ``entry``. Loads hold the load lock (one at a
        time); waiting for a busy model to drain never does, so requests,
        unloads and expiries of other models go on meanwhile."""
        info = await self.model_info(entry)
        wanted = policy.wanted(options, info, self.settings)
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

    async def _reusable(self, loaded: Loaded, entry: ModelEntry, wanted: Wanted) -> bool:
        if not loaded.runner.alive or policy.needs_reload(loaded, entry, wanted):
            return False
        if loaded.refcount == 0 and not await loaded.runner.health(timeout=5.0):
            log.warning("%s did not answer its health check: reloading", loaded.key)
            return False
        return True

    async def _load(
        self, entry: ModelEntry, info: ModelInfo, wanted: Wanted, keep_alive: float | None
    ) -> Loaded:
        """The fit loop: place, evicting others while that is what it takes."""
        parallel = policy.parallel_slots(info, self.settings)
        projector = await self._facts.projector(entry.projector_path)
        draft = await self._facts.draft(entry.draft_path)
        backoff = 0
        while True:
            if self._closing:
                raise ModelLoadFailed("the server is shutting down")
            if await self._drop_dead():
                continue  # something was unloaded: look at the devices again
            devices = await self.current_devices()
            est = fit.estimate_on(info, wanted, devices, projector, draft, parallel=parallel)
            try:
                move = fit.next_move(
                    est, wanted, devices, self.loaded_models(), self.settings, backoff
                )
            except LayoutFailure as failure:
                raise InsufficientMemory(str(failure)) from None
            if isinstance(move, fit.Evict):
                await self._evict(move.victim)
                continue  # a model was evicted: look at the devices again
            node, placement = move.node, move.placement
            request = policy.load_request(
                entry, wanted, parallel, placement, node_devices(devices, node),
                self.devices.simulated, node,
            )  # fmt: skip
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
                if not policy.may_back_off(placement, backoff):
                    raise InsufficientMemory(f"memory layout cannot be allocated: {e}") from e
                backoff += 1
                metrics.model_event(metrics.OOM_BACKOFFS, entry.name.display)
                log.info("allocation failed, retrying with %d %% less free memory", 10 * backoff)
                continue
            metrics.model_event(metrics.LOADS, entry.name.display)
            return self._loaded_record(entry, runner, wanted, request, keep_alive)

    async def _start_tracked(self, key: str, request: LoadRequest) -> Runner:
        """The runner factory, with the load's progress kept under ``key``."""
        with self._progress.tracking(key) as report:
            return await self._start_runner(request, report)

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
        names = backend_names(gpu_library(request) or "GPU", placement.gpus)
        if self.settings.new_estimates:
            if real := measured_allocations(placement, runner.measured, names):
                allocations, measured = real, True
        quantized = wanted.kv_cache_type != "f16" or wanted.batch_invariant
        if (refused := runner.kv_cache_fallback) and quantized:
            # llama.cpp refused the type: the runner made the cache f16 (keys too)
            asked = asked_cache(wanted.kv_cache_type, wanted.batch_invariant)
            log.warning(
                "%s: KV cache f16 instead of %s: %s", entry.name.display, asked, refused
            )  # fmt: skip
            wanted = replace(
                wanted,
                kv_cache_type="f16",
                kv_cache_fallback=refused if wanted.kv_cache_type != "f16" else "",
                batch_invariant=False,
                batch_invariant_fallback=refused if wanted.batch_invariant else "",
            )
        wanted = policy.invariant_where_placed(wanted, placement, request.simulated)
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
            buffer_names=names,
        )

    # -- eviction ------------------------------------------------------------------
    async def _drop_dead(self) -> bool:
        """Unload the runners that died; True if there were any."""
        dead = [m for m in self._loaded.values() if not m.runner.alive]
        for loaded in dead:
            await self._unload(loaded)
        return bool(dead)

    async def _evict(self, victim: Loaded | None) -> None:
        """Unload ``victim`` now if it is idle (or dead); if it is busy, raise
        ``MustDrain`` so that the caller waits for it outside the load lock."""
        if victim is None:
            return
        if not self._drained(victim):
            raise MustDrain(victim)
        log.info("evicting %s to make room", victim.key)
        metrics.model_event(metrics.EVICTIONS, victim.key)
        await self._unload(victim)

    def _drained(self, loaded: Loaded) -> bool:
        """No request holds it any more (or it is gone, or dead)."""
        return (
            loaded.refcount == 0
            or not loaded.runner.alive
            or self._loaded.get(loaded.key) is not loaded
        )

    # -- waiting on the state ------------------------------------------------------
    async def _until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds; it is checked whenever the
        scheduler's state changes (a release, an unload)."""
        async with self._changed:
            await self._changed.wait_for(condition)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _spawn(self, work: Awaitable[None]) -> None:
        """Background work that must not be garbage-collected mid-way."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
