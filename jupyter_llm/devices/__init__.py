"""Devices: what hardware the scheduler may place models on.

Discovery runs in a runner process (``runner`` owns spawning); this package
turns its raw list into sorted ``DeviceInfo`` with NVML's exact VRAM figures,
or replaces it with simulated devices for tests and demos.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace

from jupyter_llm.devices.nvml import nvml_memory, overlay_nvml
from jupyter_llm.devices.simulated import (
    DEVICES_ENV,
    SYSTEM_ENV,
    parse_simulated_devices,
    parse_simulated_system,
)
from jupyter_llm.devices.system import read_system_info
from jupyter_llm.devices.types import DeviceInfo, SystemInfo, sort_devices

__all__ = ["DeviceInfo", "DeviceSource", "SystemInfo", "sort_devices"]

Discover = Callable[[], Awaitable[list[DeviceInfo]]]


class DeviceSource:
    """Devices and system memory, fresh on every call, never blocking the loop.

    ``discover`` returns the raw device list of a runner's backends; it is asked
    once (devices do not come and go) while free memory is re-read each time.
    """

    def __init__(self, discover: Discover, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._discover = discover
        self._simulated = (
            parse_simulated_devices(env[DEVICES_ENV]) if env.get(DEVICES_ENV) else None
        )
        self._simulated_system = env.get(SYSTEM_ENV) or None
        self._discovered: list[DeviceInfo] | None = None
        self._lock = asyncio.Lock()

    @property
    def simulated(self) -> bool:
        return self._simulated is not None

    async def system(self) -> SystemInfo:
        loop = asyncio.get_running_loop()
        real = await loop.run_in_executor(None, read_system_info)
        if self._simulated_system:
            return parse_simulated_system(self._simulated_system, real.threads)
        return real

    async def devices(self) -> list[DeviceInfo]:
        """Sorted: discrete GPUs, integrated GPUs, then the CPU."""
        system = await self.system()
        if self._simulated is not None:
            gpus = [d for d in self._simulated if d.is_gpu]
            cpu = next((d for d in self._simulated if not d.is_gpu), None)
        else:
            raw = await self._raw_devices()
            nvml = await asyncio.get_running_loop().run_in_executor(None, nvml_memory)
            gpus = overlay_nvml([d for d in raw if d.is_gpu], nvml)
            cpu = next((d for d in raw if not d.is_gpu), None)
        cpu = replace(
            cpu or DeviceInfo(id="cpu", library="CPU", name="CPU"),
            total_memory=system.total_memory,
            free_memory=system.free_memory,
        )
        return sort_devices([*gpus, cpu])

    async def _raw_devices(self) -> list[DeviceInfo]:
        async with self._lock:
            if self._discovered is None:
                self._discovered = await self._discover()
            return self._discovered


def device_from_raw(raw: dict) -> DeviceInfo:
    """A runner's raw ggml device record as a ``DeviceInfo``."""
    kind = raw.get("type", "")
    library = "CPU" if kind == "cpu" else str(raw.get("library") or "unknown")
    return DeviceInfo(
        id=str(raw.get("pci_id") or raw.get("name") or f"dev{raw.get('index', 0)}"),
        library=library,
        name=str(raw.get("name", "")),
        description=str(raw.get("description", "")),
        integrated=kind == "igpu",
        pci_id=str(raw.get("pci_id", "")),
        total_memory=int(raw.get("total_memory", 0)),
        free_memory=int(raw.get("free_memory", 0)),
    )
