"""Simulated hardware for tests and demos: JUPYTER_LLM_SIMULATED_DEVICES and
JUPYTER_LLM_SIMULATED_SYSTEM replace discovery, and nothing else can tell."""

from __future__ import annotations

import json
from typing import Any

from jupyter_llm.devices.types import DeviceInfo, SystemInfo
from jupyter_llm.request.errors import ConfigError

DEVICES_ENV = "JUPYTER_LLM_SIMULATED_DEVICES"
SYSTEM_ENV = "JUPYTER_LLM_SIMULATED_SYSTEM"
_REQUIRED = ("id", "library", "name", "total_memory", "free_memory")


def parse_simulated_devices(raw: str) -> list[DeviceInfo]:
    try:
        items = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{DEVICES_ENV} is not valid JSON: {e}") from e
    if not isinstance(items, list):
        raise ConfigError(f"{DEVICES_ENV} must be a JSON list of devices")
    devices = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or any(k not in item for k in _REQUIRED):
            raise ConfigError(f"{DEVICES_ENV}[{i}] needs the fields {', '.join(_REQUIRED)}")
        known = {k: v for k, v in item.items() if k in DeviceInfo.__dataclass_fields__}
        try:
            device = DeviceInfo(**known)
            _check_memory(device.total_memory, device.free_memory, f"{DEVICES_ENV}[{i}]")
        except TypeError as e:
            raise ConfigError(f"{DEVICES_ENV}[{i}]: {e}") from e
        devices.append(device)
    return devices


def parse_simulated_utilization(raw: str) -> dict[str, float]:
    """Each simulated device's optional ``utilization`` (percent busy, 0-100),
    what NVML would report for a real GPU; devices without one report none."""
    out = {}
    for i, item in enumerate(json.loads(raw)):
        if "utilization" not in item:
            continue
        value = item["utilization"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
            raise ConfigError(f"{DEVICES_ENV}[{i}]: utilization must be a percent, 0 to 100")
        out[str(item["id"])] = float(value)
    return out


def parse_simulated_system(raw: str, threads: int) -> SystemInfo:
    try:
        item: Any = json.loads(raw)
        total, free = int(item["total_memory"]), int(item["free_memory"])
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{SYSTEM_ENV} must be JSON {{total_memory, free_memory}}: {e}") from e
    _check_memory(total, free, SYSTEM_ENV)
    return SystemInfo(
        total_memory=total,
        free_memory=free,
        free_swap=int(item.get("free_swap", 0)),
        threads=int(item.get("threads", threads)),
    )


def _check_memory(total: object, free: object, where: str) -> None:
    if not isinstance(total, int) or not isinstance(free, int) or total < 0 or free < 0:
        raise ConfigError(f"{where}: memory sizes must be non-negative integers (bytes)")
    if free > total:
        raise ConfigError(f"{where}: free_memory is larger than total_memory")
