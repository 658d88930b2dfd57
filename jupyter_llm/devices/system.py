"""Host memory: psutil's MemAvailable, capped by a cgroup v2 limit when one is set."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from jupyter_llm.devices.types import SystemInfo

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_limit(root: Path = CGROUP_ROOT) -> tuple[int, int] | None:
    """(limit, current usage) of this process's cgroup v2, or None when unlimited."""
    try:
        rel = _own_cgroup()
        base = root / rel.lstrip("/") if rel else root
        raw_max = (base / "memory.max").read_text().strip()
        if raw_max == "max":
            return None
        return int(raw_max), int((base / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def _own_cgroup() -> str:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return ""


def cap_by_cgroup(total: int, free: int, limit: tuple[int, int] | None) -> tuple[int, int]:
    """Pure: the smaller of the host's and the cgroup's view."""
    if limit is None:
        return total, free
    cg_max, cg_current = limit
    return min(total, cg_max), max(0, min(free, cg_max - cg_current))


def read_system_info() -> SystemInfo:
    """Blocking (reads /proc): run it in an executor."""
    vm = psutil.virtual_memory()
    total, free = cap_by_cgroup(vm.total, vm.available, cgroup_limit())
    return SystemInfo(
        total_memory=total,
        free_memory=free,
        free_swap=psutil.swap_memory().free,
        threads=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
    )
