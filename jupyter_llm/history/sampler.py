"""The history's sampler: an asyncio task started with the extension that
every ``interval`` seconds reads memory by model (the scheduler's own
figures), GPU utilization (NVML in an executor, or the simulated figure) and
the token tally into the ring. Nothing here blocks the loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jupyter_llm.devices import on_node
from jupyter_llm.history.ring import HistoryRing, Sample
from jupyter_llm.history.tokens import TOKENS, TokenTally, rates

if TYPE_CHECKING:
    from jupyter_llm.devices import DeviceInfo, DeviceSource
    from jupyter_llm.scheduler import Loaded, Scheduler

log = logging.getLogger(__name__)
INTERVAL = 2.0  # seconds between samples: 300 samples make the ten-minute window
# The device list (ids, names, totals) is read again every this many samples,
# or when the loaded models change; memory by model is the scheduler's own
# figure, so a runner is not asked for its devices every 2 seconds.
DEVICES_EVERY = 15
# A sample waits at most this many intervals for its reads: a runner that does
# not answer, or an NVML call that hangs in its thread, costs points, never the
# sampler (it would otherwise wait for ever while saying it samples).
READ_WAIT = 5


def memory_by_model(devices: list[DeviceInfo], loaded: list[Loaded]) -> dict[str, dict[str, int]]:
    """Per device id, the bytes each loaded model holds there (every device
    listed, empty when it holds nothing)."""
    memory: dict[str, dict[str, int]] = {d.id: {} for d in devices}
    for m in loaded:
        for a in m.allocations:
            device = memory.setdefault(on_node(m.node, a.device), {})
            device[m.key] = device.get(m.key, 0) + a.total
    return memory


class HistorySampler:
    """Owns the ring and the task that fills it."""

    def __init__(
        self,
        scheduler: Scheduler,
        devices: DeviceSource,
        interval: float = INTERVAL,
        tally: TokenTally = TOKENS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ring = HistoryRing()
        self.interval = interval
        self._scheduler, self._source, self._tally, self._clock = (
            scheduler, devices, tally, clock,
        )  # fmt: skip
        self._task: asyncio.Task[None] | None = None
        self._last: tuple[float, dict[str, int]] | None = None
        self._devices: tuple[tuple[str, ...], int, list[DeviceInfo]] | None = None
        self._reading: asyncio.Future[dict[str, float]] | None = None  # utilization in flight

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start sampling on the running loop (a second start does nothing)."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.sample(), self.interval * READ_WAIT)
            except Exception as e:  # one failed read costs one point, not the history
                log.debug("history sample failed: %s", e)
            await asyncio.sleep(self.interval)

    async def sample(self) -> Sample:
        """Take one sample now and add it to the ring."""
        loaded = self._scheduler.loaded_models()
        devices = await self._device_list(tuple(m.key for m in loaded))
        utilization = await self._utilization(devices)
        memory = memory_by_model(devices, loaded)
        now, totals = time.monotonic(), self._tally.totals()
        per_second = rates(self._last[1], totals, now - self._last[0]) if self._last else {}
        self._last = (now, totals)
        kept = self.ring.add(Sample(self._clock(), memory, utilization, per_second))
        self.ring.devices = [  # those the sample kept (``history_devices``), not a whole cluster's
            {"id": d.id, "name": d.name, "library": d.library, "total_memory": d.total_memory}
            for d in devices
            if d.id in kept.memory
        ]
        return kept

    async def _utilization(self, devices: list[DeviceInfo]) -> dict[str, float]:
        """The devices' utilization, with at most one read in flight: while an
        earlier read hangs (an NVML call holds an executor thread), none, so a
        stuck driver holds one thread and not one more every interval. A read
        that fails or hangs costs the utilization line, not the memory point."""
        if self._reading is not None and not self._reading.done():
            return {}
        self._reading = reading = asyncio.ensure_future(self._source.utilization(devices))
        reading.add_done_callback(_quiet)
        try:
            return await asyncio.wait_for(asyncio.shield(reading), self.interval)
        except Exception:  # TimeoutError, or the read's own (logged by ``_quiet``)
            return {}

    async def _device_list(self, models: tuple[str, ...]) -> list[DeviceInfo]:
        """The devices, read again when ``models`` changed or every ``DEVICES_EVERY`` calls."""
        if self._devices is not None:
            seen, age, devices = self._devices
            if seen == models and age < DEVICES_EVERY:
                self._devices = (seen, age + 1, devices)
                return devices
        devices = await self._scheduler.current_devices()
        self._devices = (models, 1, devices)
        return devices


def _quiet(reading: asyncio.Future[dict[str, float]]) -> None:
    """A read that failed after its sample stopped waiting: logged, not left unretrieved."""
    if not reading.cancelled() and (e := reading.exception()) is not None:
        log.debug("history utilization read failed: %s", e)
