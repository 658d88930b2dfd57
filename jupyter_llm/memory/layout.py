"""Where a model's layers go: GPUs first (in device sort order), the rest on the CPU.

Rules (BEHAVIOUR.md, Memory): layers fill from the last block down (the output
layer first), discrete GPUs before integrated ones, the fewest GPUs that hold
everything, a GPU only if it holds its graph, the per-GPU minimum and two
layers. Pure: the caller passes free memory already net of what it has loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_llm.memory.estimate import Estimate

MIB = 1 << 20
MIN_GPU_BYTES = 457 * MIB
CPU = "cpu"


@dataclass(frozen=True)
class GpuSlot:
    """A GPU as the layout sees it: how much we may still use."""

    id: str
    library: str
    free: int
    integrated: bool = False


@dataclass(frozen=True)
class Allocation:
    device: str  # a device id, or "cpu"
    weights: int
    kv_cache: int
    graph: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.graph


@dataclass(frozen=True)
class Placement:
    gpu_layers: tuple[tuple[str, int], ...]  # (device id, layers) in device order
    allocations: tuple[Allocation, ...]  # one per used GPU, then the CPU
    n_gpu_layers: int  # llama.cpp's count: the last N layers (output included) offloaded
    n_layers: int  # blocks + output layer

    @property
    def gpus(self) -> list[str]:
        return [device for device, _ in self.gpu_layers]

    @property
    def tensor_split(self) -> list[float]:
        return [float(n) for _, n in self.gpu_layers]

    @property
    def vram(self) -> int:
        return sum(a.total for a in self.allocations if a.device != CPU)

    @property
    def total(self) -> int:
        return sum(a.total for a in self.allocations)

    def on(self, device: str) -> int:
        return sum(a.total for a in self.allocations if a.device == device)

    def layers_on(self, device: str) -> int:
        """Layers (the output layer counting as one) placed on ``device``."""
        if device == CPU:
            return self.n_layers - self.n_gpu_layers
        return sum(n for d, n in self.gpu_layers if d == device)


class LayoutFailure(Exception):
    """No acceptable layout with the memory that is free now."""


class DoesNotFit(LayoutFailure):
    def __init__(self) -> None:
        super().__init__("model does not fit in the free GPU memory")


class NeedsSystemMemory(LayoutFailure):
    def __init__(self, required: int, available: int) -> None:
        super().__init__(
            f"model requires more system memory ({format_bytes(required)}) "
            f"than is available ({format_bytes(available)})"
        )
        self.required, self.available = required, available


class CannotAllocateForced(LayoutFailure):
    def __init__(self, num_gpu: int) -> None:
        super().__init__(f"memory layout cannot be allocated with num_gpu = {num_gpu}")
        self.num_gpu = num_gpu


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def plan_layout(
    est: Estimate,
    gpus: list[GpuSlot],
    system_free: int,
    *,
    num_gpu: int = -1,
    require_full: bool = False,
    gpu_overhead: int = 0,
) -> Placement:
    """The placement for ``est`` on ``gpus`` (already in device sort order).

    ``require_full`` (other models are loaded): everything on GPUs or
    ``DoesNotFit``. ``num_gpu`` -1: automatic, 0: CPU only, N: exactly N layers
    on GPUs or ``CannotAllocateForced``. A CPU part larger than ``system_free``
    is ``NeedsSystemMemory``.
    """
    n_total = est.n_layer + 1
    order = [est.n_layer, *range(est.n_layer - 1, -1, -1)]  # output first, then last block down
    sizes = [est.layer_size(i) for i in order]
    biggest = max(sizes) if sizes else 0

    def room(gpu: GpuSlot, graph: int) -> int:
        return gpu.free - gpu_overhead - MIN_GPU_BYTES - graph

    def fill(candidates: list[GpuSlot], limit: int, graph: int) -> list[tuple[GpuSlot, int]]:
        assigned, placed = [], 0
        for gpu in candidates:
            # the first GPU with layers also holds the projector and the draft model
            extra = 0 if assigned else est.projector_total + est.draft_gpu
            left, n = room(gpu, graph) - extra, 0
            while placed < limit and sizes[placed] <= left:
                left -= sizes[placed]
                placed += 1
                n += 1
            if n:
                assigned.append((gpu, n))
        return assigned

    assignment: list[tuple[GpuSlot, int]] = []
    wanted = n_total if num_gpu < 0 else min(num_gpu, n_total)
    if gpus and wanted > 0:
        for k in range(1, len(gpus) + 1):  # the fewest GPUs (in sort order) that hold it all
            graph = est.gpu_graph_full if k == 1 else est.gpu_graph_partial
            trial = fill(gpus[:k], wanted, graph)
            if sum(n for _, n in trial) == wanted:
                assignment = trial
                break
        else:
            if num_gpu > 0:
                raise CannotAllocateForced(num_gpu)
            if require_full:
                raise DoesNotFit()
            viable = [g for g in gpus if room(g, est.gpu_graph_partial) >= 2 * biggest]
            assignment = fill(viable, wanted, est.gpu_graph_partial)
    return _placement(est, order, assignment, system_free, n_total)


def _placement(
    est: Estimate,
    order: list[int],
    assignment: list[tuple[GpuSlot, int]],
    system_free: int,
    n_total: int,
) -> Placement:
    allocations = []
    offloaded = sum(n for _, n in assignment)
    split = len(assignment) > 1 or offloaded < n_total
    start = 0
    for gpu, n in assignment:
        layers = order[start : start + n]
        start += n
        graph = est.gpu_graph_partial if split else est.gpu_graph_full
        allocation = _allocation(gpu.id, est, layers, graph)
        allocations.append(allocation if start > n else _with_projector(allocation, est))
    cpu_layers = order[start:]
    # without a GPU, ggml's CPU backend alone; beside one, the host's buffer
    # (inputs, and the CPU's layers' non-offloaded operations)
    if not assignment:
        cpu_graph = est.graph_full
    else:
        cpu_graph = est.host_graph_partial if cpu_layers else est.host_graph_full
    cpu = _allocation(CPU, est, cpu_layers, cpu_graph)
    # a tied output layer left on the CPU is the input tensor itself (llama.cpp
    # duplicates token_embd only when the output layer is offloaded)
    output_on_cpu = est.n_layer in cpu_layers or est.output_on_cpu
    tied_on_cpu = est.tied_output if output_on_cpu else 0
    # an offloaded output layer whose matrix the GPU cannot take leaves it on the CPU
    kept = est.output_weights if est.output_on_cpu and est.n_layer not in cpu_layers else 0
    weights = cpu.weights + kept + est.input_weights - tied_on_cpu
    cpu = Allocation(CPU, weights, cpu.kv_cache, cpu.graph)
    if not assignment:
        cpu = _with_projector(cpu, est)
    if est.draft is not None:  # the draft model beside the target
        d = est.draft
        if assignment:  # on the first GPU (_with_projector), its host part here
            cpu = Allocation(
                CPU, cpu.weights + d.host_weights, cpu.kv_cache, cpu.graph + d.host_graph
            )
        else:
            cpu = Allocation(
                CPU, cpu.weights + d.cpu_weights, cpu.kv_cache + d.kv, cpu.graph + d.cpu_graph
            )
    if cpu.total > system_free:
        raise NeedsSystemMemory(cpu.total, system_free)
    allocations.append(cpu)
    return Placement(
        gpu_layers=tuple((gpu.id, n) for gpu, n in assignment),
        allocations=tuple(allocations),
        n_gpu_layers=offloaded,
        n_layers=n_total,
    )


def _with_projector(a: Allocation, est: Estimate) -> Allocation:
    """The first GPU with layers (or the CPU, without one) also holds the
    projector, and a draft model offloaded whole."""
    weights, kv, graph = est.projector_weights, 0, est.projector_graph
    if est.draft is not None and a.device != CPU:
        d = est.draft
        weights, kv, graph = weights + d.gpu_weights, d.kv, graph + d.gpu_graph
    return Allocation(a.device, a.weights + weights, a.kv_cache + kv, a.graph + graph)


def _allocation(device: str, est: Estimate, layers: list[int], graph: int) -> Allocation:
    weights = sum(est.layer_weights[i] for i in layers if i < est.n_layer)
    if est.n_layer in layers:
        weights += est.output_weights if device == CPU else est.layer_size(est.n_layer)
    kv = sum(est.layer_kv[i] for i in layers if i < est.n_layer)
    return Allocation(device, weights, kv, graph)
