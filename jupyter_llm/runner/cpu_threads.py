"""The default thread count of a runner: the physical cores this process may use.

llama.cpp decodes fastest with one thread per physical core it really gets:
more threads than that (SMT siblings, CPUs outside the affinity mask, a
container's CPU quota) wait for each other at every step, and the efficiency
cores of a hybrid CPU hold the performance cores back. So the count is

* the CPUs in this process's affinity mask (else the online ones),
* only the performance cores of those, where the OS tells them apart,
* grouped into physical cores by their topology in sysfs,
* at most a cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``),
  rounded up, the lowest one from the process's own cgroup up to the root,

and at least 1. Everything here reads files under a ``root`` that stands for
``/`` (tests build fake sysfs, procfs and cgroupfs trees); ``default_threads``
reads this machine, and falls back to ``sysctl`` on macOS and to the physical
core count psutil or ``os.cpu_count()`` give elsewhere.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path

CPU_DIR = "sys/devices/system/cpu"
CGROUP_DIR = "sys/fs/cgroup"


def read_text(path: Path) -> str | None:
    """The stripped contents of a small kernel file; ``None`` if unreadable."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPU ids of a kernel CPU list such as ``"0-3,8,10-11"``; a bad list is empty."""
    cpus: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            return frozenset()
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def read_cpu_list(path: Path) -> frozenset[int] | None:
    text = read_text(path)
    return (parse_cpu_list(text) or None) if text is not None else None


def online_cpus(root: Path) -> frozenset[int] | None:
    return read_cpu_list(root / CPU_DIR / "online")


def performance_cpus(root: Path) -> frozenset[int] | None:
    """The performance cores of a Linux hybrid CPU (Intel's ``cpu_core`` PMU,
    beside ``cpu_atom``); ``None`` where the kernel does not tell them apart."""
    return read_cpu_list(root / "sys/devices/cpu_core/cpus")


def core_key(root: Path, cpu: int) -> Hashable:
    """What logical CPU ``cpu`` shares with its SMT siblings, and no other CPU:
    package, die and core id; else its sibling list; else the CPU itself."""
    topology = root / CPU_DIR / f"cpu{cpu}" / "topology"
    package = read_text(topology / "physical_package_id")
    core = read_text(topology / "core_id")
    if package is not None and core is not None:
        return ("core", package, read_text(topology / "die_id"), core)
    for name in ("thread_siblings_list", "core_cpus_list"):
        if siblings := read_cpu_list(topology / name):
            return ("siblings", siblings)
    return ("cpu", cpu)


def physical_cores(root: Path, cpus: Iterable[int]) -> int:
    """How many physical cores ``cpus`` lie on (a core counts once however
    many of its SMT threads are in ``cpus``)."""
    return len({core_key(root, cpu) for cpu in cpus})


def own_cgroups(root: Path) -> list[tuple[list[str], str]]:
    """``(controllers, path)`` of each line of ``/proc/self/cgroup``; v2's
    line has no controllers."""
    text = read_text(root / "proc/self/cgroup") or ""
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            controllers = [c for c in parts[1].split(",") if c]
            found.append((controllers, parts[2]))
    return found


def cgroup_dirs(base: Path, path: str) -> list[Path]:
    """The process's cgroup folder and each parent up to ``base``, deepest
    first. Levels that are not there are left out: a container without a
    cgroup namespace sees its own cgroup at the mount's root while
    ``/proc/self/cgroup`` names it by its full path on the host."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    levels = [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in levels if d.is_dir()]


def v2_limit(folder: Path) -> float | None:
    """CPUs that ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") allows; ``None``: no limit."""
    fields = (read_text(folder / "cpu.max") or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return quota_cpus(fields[0], fields[1])


def v1_limit(folder: Path) -> float | None:
    """CPUs that ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` allow; -1: no limit."""
    quota = read_text(folder / "cpu.cfs_quota_us")
    period = read_text(folder / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return quota_cpus(quota, period)


def quota_cpus(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_limit(root: Path) -> float | None:
    """The lowest CPU quota on the way from this process's cgroup to the root
    (v2 and v1, whichever are mounted), in CPUs; ``None``: no quota."""
    base = root / CGROUP_DIR
    limits: list[float] = []
    for controllers, path in own_cgroups(root):
        if not controllers:  # v2: the unified hierarchy (beside v1 in hybrid mode)
            mounts, read = [base, base / "unified"], v2_limit
        elif "cpu" in controllers:
            names = dict.fromkeys([",".join(controllers), "cpu", "cpu,cpuacct", "cpuacct,cpu"])
            mounts, read = [base / name for name in names], v1_limit
        else:
            continue
        for mount in mounts:
            for folder in cgroup_dirs(mount, path):
                if (limit := read(folder)) is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def linux_threads(root: Path, affinity: frozenset[int] | None) -> int | None:
    """Threads for this process from the trees under ``root``: ``affinity``
    (else the online CPUs), performance cores only, counted by physical core,
    capped by the cgroup quota rounded up. ``None`` if no CPU is known."""
    cpus = affinity or online_cpus(root)
    if not cpus:
        return None
    performance = performance_cpus(root)
    if performance and cpus & performance:
        cpus = cpus & performance
    cores = physical_cores(root, cpus)
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def darwin_threads(sysctl: Callable[[str], int | None]) -> int | None:
    """macOS: the performance cores (``hw.perflevel0`` is the fastest level on
    Apple silicon), else all physical cores."""
    for name in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):
        if (count := sysctl(name)) and count > 0:
            return count
    return None


def read_sysctl(name: str) -> int | None:
    try:
        done = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False
        )
        return int(done.stdout.strip()) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def fallback_threads() -> int:
    """Physical cores as psutil counts them, else every logical CPU."""
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:  # psutil cannot tell on this platform
        physical = None
    return max(1, physical or os.cpu_count() or 1)


def own_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (Linux: its affinity mask), else None."""
    if sys.platform.startswith("linux") and hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return None


def default_threads() -> int:
    """The thread count a runner on this machine uses when none was asked for."""
    if sys.platform.startswith("linux"):
        affinity = own_cpus()
        if (count := linux_threads(Path("/"), affinity)) is not None:
            return count
    elif sys.platform == "darwin":
        if (count := darwin_threads(read_sysctl)) is not None:
            return count
    return fallback_threads()


def own_cpu_seconds() -> tuple[float, float]:
    """This process's CPU time (all its threads, user and system) and the
    monotonic clock, in seconds: two reads apart say how much of its
    threads' cores it got meanwhile (``thread_tuning.CpuWatch``)."""
    times = os.times()
    return times.user + times.system, time.monotonic()


def idle_jiffies(cpus: Iterable[int], root: Path = Path("/")) -> tuple[int, int] | None:
    """Idle (idle and iowait) and all jiffies, summed over ``cpus``, from
    ``proc/stat``: two reads apart say how much of those CPUs nobody used
    meanwhile (``thread_tuning.free_cores``). None where it is unreadable."""
    text = read_text(root / "proc" / "stat")
    if text is None:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    idle = total = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name not in wanted:
            continue
        try:
            fields = [int(f) for f in rest.split()]
        except ValueError:
            return None
        idle += sum(fields[3:5])
        total += sum(fields[:8])  # not guest time: it is in user time already
    return (idle, total) if total else None


def run_queue_wait(root: Path = Path("/")) -> int | None:
    """Nanoseconds this process's threads have spent runnable but waiting for
    a CPU, summed over its threads (the second field of each
    ``proc/self/task/*/schedstat``): two reads apart say how many cores'
    worth of its threads other work kept waiting meanwhile
    (``thread_tuning.CpuWatch``). None where the kernel keeps no such count
    (no file, or one that reads zero time run: schedstats turned off). A
    thread that ends takes its waits with it; the runner's threads live as
    long as it does."""
    tasks = root / "proc" / "self" / "task"
    try:
        ids = os.listdir(tasks)
    except OSError:
        return None
    ran = waited = 0
    for tid in ids:
        text = read_text(tasks / tid / "schedstat")  # None: the thread ended meanwhile
        fields = text.split() if text else []
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return waited if ran else None
