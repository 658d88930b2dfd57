"""What llama.cpp actually allocated, read from its buffer-size log lines.

load_tensors:   CPU_Mapped model buffer size =    12.34 MiB
llama_kv_cache:        CPU KV buffer size =    64.00 MiB
sched_reserve:       CUDA0 compute buffer size =   120.00 MiB
"""

from __future__ import annotations

import re

_LINE = re.compile(
    r"\b([A-Za-z][\w-]*?)\s+(model|KV|RS|compute|output)\s+buffer size\s*=\s*([\d.]+)\s*([KMG]i?B)"
)
_UNITS = {
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "KB": 1 << 10,
    "MB": 1 << 20,
    "GB": 1 << 30,
}
_KINDS = {
    "model": "weights",
    "KV": "kv_cache",
    "RS": "kv_cache",
    "compute": "graph",
    "output": "graph",
}


def parse_buffer_line(line: str) -> tuple[str, str, int] | None:
    """(backend buffer name, "weights"|"kv_cache"|"graph", bytes), or None."""
    m = _LINE.search(line)
    if not m:
        return None
    name, kind, size, unit = m.groups()
    device = "cpu" if name.startswith("CPU") or name.endswith("_Host") else name
    return device, _KINDS[kind], int(float(size) * _UNITS[unit])


class AllocationLog:
    """Sums buffer sizes per device while a model loads."""

    def __init__(self) -> None:
        self.devices: dict[str, dict[str, int]] = {}

    def feed(self, line: str) -> None:
        if parsed := parse_buffer_line(line):
            device, kind, size = parsed
            sizes = self.devices.setdefault(device, {"weights": 0, "kv_cache": 0, "graph": 0})
            sizes[kind] += size

    def reset(self) -> None:
        self.devices = {}
