"""The wait after a GPU unload: the driver reports freed VRAM with a lag, and
the next placement must see it, or it would evict more than it needs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from jupyter_llm.devices import DeviceInfo
from jupyter_llm.scheduler.policy import vram_recovered, vram_to_watch

log = logging.getLogger(__name__)

VRAM_RECOVERY_POLL = 0.25
VRAM_RECOVERY_TIMEOUT = 5.0


async def wait_for_vram_recovery(
    current_devices: Callable[[], Awaitable[list[DeviceInfo]]],
    before: Mapping[str, int],
    held: Mapping[str, int],
) -> None:
    """Wait until 75 % of the VRAM ``held`` is free again (polling 250 ms, at
    most 5 s); ``before``: each device's free memory before the unload.
    iGPU-only runners (shared memory) do not wait."""
    watched = vram_to_watch(held, await current_devices()) if held else {}
    deadline = time.monotonic() + VRAM_RECOVERY_TIMEOUT
    while watched:
        now = {d.id: d.free_memory for d in await current_devices()}
        if vram_recovered(before, now, watched):
            return
        if time.monotonic() >= deadline:
            log.info("free VRAM did not recover within %.0fs", VRAM_RECOVERY_TIMEOUT)
            return
        await asyncio.sleep(VRAM_RECOVERY_POLL)
