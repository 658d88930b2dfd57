"""Devices: what hardware the scheduler may place models on.

Discovery runs in a runner process (``runner`` owns spawning); this package
turns its raw list into sorted ``DeviceInfo`` with NVML's exact VRAM figures,
or replaces it with simulated devices for tests and demos.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from jupyter_llm.devices.host import HOST_ENV, host_gpus, parse_simulated_host
from jupyter_llm.devices.notices import HostGPU, Notice, idle_gpu_notices, runner_notice
from jupyter_llm.devices.nvml import nvml_memory, nvml_utilization, overlay_nvml, utilization_of
from jupyter_llm.devices.simulated import (
    DEVICES_ENV,
    SYSTEM_ENV,
    parse_simulated_devices,
    parse_simulated_system,
    parse_simulated_utilization,
)
from jupyter_llm.devices.system import read_system_info
from jupyter_llm.devices.types import (
    DeviceInfo,
    NodeInfo,
    SystemInfo,
    gpu_max_tensor,
    node_devices,
    nodes_by_free,
    on_node,
    serving_gpus,
    sort_devices,
    without_our_use,
)

__all__ = [
    "DeviceInfo",
    "DeviceSource",
    "HostGPU",
    "NodeInfo",
    "Notice",
    "SystemInfo",
    "gpu_max_tensor",
    "node_devices",
    "nodes_by_free",
    "on_node",
    "serving_gpus",
    "sort_devices",
]

Discover = Callable[[], Awaitable[list[DeviceInfo]]]


class DeviceSource:
    """Devices and system memory, fresh on every call, never blocking the loop.

    ``discover`` returns the raw device list of a runner's backends; it is asked
    once (devices do not come and go) while free memory is re-read each time.
    """

    def __init__(
        self,
        discover: Discover,
        environ: dict[str, str] | None = None,
        python: str = "",
    ) -> None:
        env = os.environ if environ is None else environ
        self._discover = discover
        self.python = python  # the runner interpreter, for notices
        self.discovery_error = ""  # why discovery failed, when it raised
        self._simulated_host = parse_simulated_host(env[HOST_ENV]) if env.get(HOST_ENV) else None
        self._simulated = (
            parse_simulated_devices(env[DEVICES_ENV]) if env.get(DEVICES_ENV) else None
        )
        self._simulated_system = env.get(SYSTEM_ENV) or None
        self._simulated_busy = (
            parse_simulated_utilization(env[DEVICES_ENV]) if env.get(DEVICES_ENV) else None
        )
        self._discovered: list[DeviceInfo] | None = None
        self._lock = asyncio.Lock()

    @property
    def simulated(self) -> bool:
        return self._simulated is not None

    async def system(self, used: int = 0) -> SystemInfo:
        """Host memory. ``used``: bytes our runners hold, subtracted only from a
        simulated system (a real one already shows them)."""
        if self._simulated_system:
            sim = parse_simulated_system(self._simulated_system, os.cpu_count() or 1)
            return replace(sim, free_memory=max(0, sim.free_memory - used))
        return await asyncio.get_running_loop().run_in_executor(None, read_system_info)

    async def devices(
        self,
        used: Mapping[str, int] | None = None,
        fresh: Discover | None = None,
    ) -> list[DeviceInfo]:
        """Sorted: discrete GPUs, integrated GPUs, then the CPU.

        ``fresh`` asks a loaded runner for its backends' current free memory
        (cheaper and more current than a discovery runner). ``used`` is what our
        runners hold per device id ("cpu" for the host); simulated devices
        subtract it, as real ones would show it, and a real GPU never shows
        more free than its total less that (``without_our_use``).
        """
        used = used or {}
        system = await self.system(used.get("cpu", 0))
        if self._simulated is not None:
            gpus = [
                replace(d, free_memory=max(0, d.free_memory - used.get(d.id, 0)))
                for d in self._simulated
                if d.is_gpu
            ]
            cpu = next((d for d in self._simulated if not d.is_gpu), None)
        else:
            raw = None
            if fresh is not None:
                try:
                    raw = await fresh()
                except Exception:  # the runner went away: fall back to discovery
                    raw = None
            raw = raw if raw is not None else await self._raw_devices()
            nvml = await asyncio.get_running_loop().run_in_executor(None, nvml_memory)
            gpus = [
                without_our_use(d, used.get(d.id, 0))
                for d in overlay_nvml([d for d in raw if d.is_gpu], nvml)
            ]
            cpu = next((d for d in raw if not d.is_gpu), None)
        cpu = replace(
            cpu or DeviceInfo(id="cpu", library="CPU", name="CPU"),
            id="cpu",
            total_memory=system.total_memory,
            free_memory=system.free_memory,
        )
        return sort_devices([*gpus, cpu])

    async def utilization(self, devices: list[DeviceInfo]) -> dict[str, float]:
        """Percent busy per GPU id, where NVML reports it (or the simulated
        figure); GPUs without one are left out. NVML is read in an executor."""
        if self._simulated_busy is not None:
            return dict(self._simulated_busy)
        if not any(d.library == "CUDA" for d in devices):
            return {}
        nvml = await asyncio.get_running_loop().run_in_executor(None, nvml_utilization)
        return utilization_of(devices, nvml)

    async def _raw_devices(self) -> list[DeviceInfo]:
        async with self._lock:
            if self._discovered is None:
                try:
                    self._discovered = await self._discover()
                except Exception as e:  # a bad interpreter costs the GPUs, not the server
                    self.discovery_error = str(e) or type(e).__name__
                    self._discovered = []
            return self._discovered

    async def nodes(self) -> list[NodeInfo]:
        """The machines devices are on: here, only this server's own."""
        return [NodeInfo(id="", name=socket.gethostname())]

    async def close(self) -> None:
        """Release what discovery holds (nothing here; a cluster's actors)."""

    async def host_gpus(self) -> list[HostGPU]:
        """The GPUs the host shows (NVML, device nodes, the OS), or simulated ones."""
        if self._simulated_host is not None:
            return list(self._simulated_host)
        return await asyncio.get_running_loop().run_in_executor(None, host_gpus)

    async def notices(self, devices: list[DeviceInfo] | None = None) -> list[Notice]:
        """What is wrong with the GPU setup: a failed discovery, GPUs the build
        cannot use (each with the command that fixes it)."""
        devices = devices if devices is not None else await self.devices()
        out = []
        if self.discovery_error:
            out.append(runner_notice(self.python or "(this one)", self.discovery_error))
        libraries = {d.library for d in devices}
        out.extend(idle_gpu_notices(await self.host_gpus(), libraries))
        return out


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
