"""What llama.cpp really allocated, and what it failed to allocate.

The runner feeds llama.cpp's log lines to ``AllocationLog`` while a model loads
(buffer sizes per backend, and the first line that reports a failed
allocation), and after it: a context made later (the embeddings') is what
the log ``grown`` by around it. The scheduler maps those backend buffer names
("CPU_Mapped", "CUDA0", ...) onto its own device ids with
``measured_allocations`` (or adds the growth to its estimate: ``with_growth``).
Pure: text and plain data in, plain data out; knowledge of llama.cpp's log
wording lives only here.

    load_tensors:   CPU_Mapped model buffer size =    12.34 MiB
    llama_kv_cache:        CPU KV buffer size =    64.00 MiB
    sched_reserve:       CUDA0 compute buffer size =   120.00 MiB

A vision projector (clip, inside mtmd) names its backend once, then its
weights without one, then its compute buffers; a reservation it makes again
(the flash-attention probe) replaces its first rather than adding to it:

    clip_ctx: CLIP using CUDA0 backend
    load_hparams: model size:         3.21 MiB
    reserve_compute_meta:      CUDA0 compute buffer size =     1.50 MiB
"""

from __future__ import annotations

import re

from jupyter_llm.memory.layout import CPU, Allocation, Placement

KINDS = ("weights", "kv_cache", "graph")

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
_CLIP_BACKEND = re.compile(r"\bCLIP using (\S+) backend")
_CLIP_WEIGHTS = re.compile(r"\bmodel size:\s*([\d.]+)\s*([KMG]i?B)")
_CLIP_RESERVE = "reserve_compute_meta"
# How ggml and llama.cpp word a failed allocation (CPU malloc, CUDA, Metal,
# Vulkan, the KV cache and the compute graph reserve).
_FAILURE = re.compile(
    r"failed to allocate|unable to allocate|out of memory|cudaMalloc failed"
    r"|failed to reserve|ErrorOutOfDeviceMemory",
    re.IGNORECASE,
)


def parse_buffer_line(line: str) -> tuple[str, str, int] | None:
    """(backend buffer name, "weights"|"kv_cache"|"graph", bytes), or None."""
    m = _LINE.search(line)
    if not m:
        return None
    name, kind, size, unit = m.groups()
    return _device(name), _KINDS[kind], _bytes(size, unit)


def _device(name: str) -> str:
    return CPU if name.startswith("CPU") or name.endswith("_Host") else name


def _bytes(size: str, unit: str) -> int:
    return int(float(size) * _UNITS[unit])


def is_allocation_failure_line(line: str) -> bool:
    """Does this llama.cpp log line report memory that could not be allocated?"""
    return bool(_FAILURE.search(line))


class AllocationLog:
    """Sums buffer sizes per device while a model loads, and keeps the first
    line that reported a failed allocation."""

    def __init__(self) -> None:
        self.devices: dict[str, dict[str, int]] = {}
        self.failure = ""
        self._clip_device = ""  # the projector's backend, once clip named it
        self._clip_graph: dict[str, int] = {}  # its latest reservation per device

    def feed(self, line: str) -> None:
        if parsed := parse_buffer_line(line):
            device, kind, size = parsed
            if _CLIP_RESERVE in line:
                if device in self._clip_graph:  # reserved again: the new one replaces it
                    for old, n in self._clip_graph.items():
                        self._add(old, "graph", -n)
                    self._clip_graph = {}
                self._clip_graph[device] = size
            self._add(device, kind, size)
        elif m := _CLIP_BACKEND.search(line):
            self._clip_device = _device(m.group(1))
        elif self._clip_device and (m := _CLIP_WEIGHTS.search(line)):
            self._add(self._clip_device, "weights", _bytes(m.group(1), m.group(2)))
        elif not self.failure and is_allocation_failure_line(line):
            self.failure = line.strip()

    def snapshot(self) -> Sizes:
        """The figures so far, apart from the log (which goes on adding)."""
        return {device: dict(kinds) for device, kinds in self.devices.items()}

    def grows(self, device: str, kind: str, size: int) -> None:
        """A buffer the load logged that llama.cpp grows later by its own
        rule (the logits' output buffer: ``memory.outputs.output_growth``),
        so the figures are what the runner will hold."""
        self._add(device, kind, size)

    def _add(self, device: str, kind: str, size: int) -> None:
        sizes = self.devices.setdefault(device, dict.fromkeys(KINDS, 0))
        sizes[kind] += size

    def reset(self) -> None:
        self.devices = {}
        self.failure = ""
        self._clip_device = ""
        self._clip_graph = {}


Sizes = dict[str, dict[str, int]]  # device -> kind -> bytes, as ``AllocationLog.devices``


def is_sizes(value: object) -> bool:
    """Is ``value`` a runner's ``Sizes`` (devices, each kinds of ``KINDS``
    to non-negative byte counts)?"""
    return isinstance(value, dict) and all(
        isinstance(device, str)
        and isinstance(kinds, dict)
        and all(kind in KINDS and type(size) is int and size >= 0 for kind, size in kinds.items())
        for device, kinds in value.items()
    )


def merged(*parts: Sizes) -> Sizes:
    """The sizes of ``parts`` added up per device and kind."""
    out: Sizes = {}
    for part in parts:
        for device, kinds in part.items():
            sizes = out.setdefault(device, dict.fromkeys(KINDS, 0))
            for kind, size in kinds.items():
                sizes[kind] = sizes.get(kind, 0) + size
    return out


def grown(after: Sizes, before: Sizes) -> Sizes:
    """What ``after`` holds beyond ``before`` (a log's figures around one
    allocation: a context made after the load), devices that grew only."""
    out: Sizes = {}
    for device, kinds in after.items():
        was = before.get(device, {})
        more = {kind: size - was.get(kind, 0) for kind, size in kinds.items()}
        if any(more.values()):
            out[device] = {kind: max(0, size) for kind, size in more.items()}
    return out


def with_growth(
    allocations: tuple[Allocation, ...], growth: Sizes, names: dict[str, str]
) -> tuple[Allocation, ...]:
    """A layout's ``allocations`` with what the runner made since its load
    (``growth``, by buffer name: ``names`` maps them to device ids) added to
    the devices that hold it; a buffer on a device the layout does not hold
    (the runner computed elsewhere: simulated devices) goes to the CPU."""
    held = {a.device for a in allocations}

    def device(name: str) -> str:
        return found if (found := names.get(name, name)) in held else CPU

    extra = merged(*({device(name): kinds} for name, kinds in growth.items()))
    if CPU in extra and CPU not in held:
        allocations = (*allocations, Allocation(CPU, 0, 0, 0))
    return tuple(
        Allocation(a.device, *(getattr(a, k) + extra.get(a.device, {}).get(k, 0) for k in KINDS))
        for a in allocations
    )


def backend_names(library: str, gpus: list[str]) -> dict[str, str]:
    """llama.cpp names a runner's GPU buffers CUDA0, CUDA1... in the order it
    sees them (only the visible ones): map those names to our device ids."""
    return {f"{library}{i}": g for i, g in enumerate(gpus)}


def measured_allocations(
    placement: Placement, measured: dict[str, dict[str, int]], names: dict[str, str]
) -> tuple[Allocation, ...] | None:
    """The engine's own figures per device. When the runner computed elsewhere
    than the layout says (simulated devices), the measured totals are spread over
    the layout's devices in its proportions."""
    if not measured:
        return None
    by_device = {names.get(name, name): sizes for name, sizes in measured.items()}
    planned = {a.device for a in placement.allocations if a.total}
    if set(by_device) <= planned | {CPU} and set(by_device) >= planned - {CPU}:
        return tuple(
            Allocation(a.device, *(by_device.get(a.device, {}).get(k, 0) for k in KINDS))
            for a in placement.allocations
        )
    totals = {k: sum(s.get(k, 0) for s in measured.values()) for k in KINDS}
    est = {k: sum(getattr(a, k) for a in placement.allocations) for k in KINDS}

    def scaled(a: Allocation, kind: str) -> int:
        return round(getattr(a, kind) * totals[kind] / est[kind]) if est[kind] else 0

    return tuple(
        Allocation(a.device, *(scaled(a, k) for k in KINDS)) for a in placement.allocations
    )
