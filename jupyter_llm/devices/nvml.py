"""NVML overlay: exact free/total VRAM for NVIDIA devices when a driver is present.

Initialised lazily, once; with no driver it stays silent and changes nothing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from jupyter_llm.devices.types import DeviceInfo

log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict[str, bool] = {}


def _init() -> bool:
    with _lock:
        if "ok" not in _state:
            try:
                import pynvml

                pynvml.nvmlInit()
                _state["ok"] = True
            except Exception:  # no library, no driver, no device: all mean "no NVML"
                _state["ok"] = False
        return _state["ok"]


def nvml_memory() -> dict[str, tuple[int, int, str]]:
    """{uuid or pci bus id (lower case): (free, total, driver)}; empty without NVML."""
    if not _init():
        return {}
    import pynvml

    out: dict[str, tuple[int, int, str]] = {}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            pci = pynvml.nvmlDeviceGetPciInfo(handle).busId
            pci = pci.decode() if isinstance(pci, bytes) else str(pci)
            entry = (int(mem.free), int(mem.total), driver)
            out[uuid.lower()] = entry
            out[pci.lower()] = entry
    except Exception as e:
        log.debug("NVML query failed: %s", e)
    return out


def nvml_utilization() -> dict[str, float]:
    """{uuid or pci bus id (lower case): percent of the last sample period the
    GPU was busy}; empty without NVML. Blocking: run it in an executor."""
    if not _init():
        return {}
    import pynvml

    out: dict[str, float] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            busy = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            pci = pynvml.nvmlDeviceGetPciInfo(handle).busId
            for key in (uuid, pci):
                out[(key.decode() if isinstance(key, bytes) else str(key)).lower()] = busy
    except Exception as e:
        log.debug("NVML utilization query failed: %s", e)
    return out


def utilization_of(devices: list[DeviceInfo], nvml: dict[str, float]) -> dict[str, float]:
    """Pure: the utilization NVML reports for each CUDA device it knows, by our
    device id. Only this machine's devices: a cluster node's GPU may share a
    PCI bus id with one here."""
    out = {}
    for d in devices:
        if d.library != "CUDA" or d.node:
            continue
        for key in (d.id.lower(), _long_pci(d.pci_id), d.pci_id.lower()):
            if key and key in nvml:
                out[d.id] = nvml[key]
                break
    return out


def overlay_nvml(
    devices: list[DeviceInfo], nvml: dict[str, tuple[int, int, str]]
) -> list[DeviceInfo]:
    """Pure: replace free/total of CUDA devices that NVML knows by id or PCI id."""
    result = []
    for d in devices:
        hit = None
        if d.library == "CUDA":
            hit = (
                nvml.get(d.id.lower())
                or nvml.get(_long_pci(d.pci_id))
                or nvml.get(d.pci_id.lower())
            )
        if hit:
            free, total, driver = hit
            d = replace(d, free_memory=free, total_memory=total, driver=d.driver or driver)
        result.append(d)
    return result


def _long_pci(pci: str) -> str:
    """NVML spells bus ids with an 8-digit domain; ggml with 4."""
    pci = pci.lower()
    if pci.count(":") == 2 and len(pci.split(":")[0]) == 4:
        return "0000" + pci
    return pci
