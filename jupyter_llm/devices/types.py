"""Device facts as one type, and the one sort order used everywhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    """One compute device as a runner's backends see it (memory in bytes)."""

    id: str
    library: str  # CUDA, ROCm, Vulkan, Metal, CPU
    name: str
    description: str = ""
    integrated: bool = False
    pci_id: str = ""
    total_memory: int = 0
    free_memory: int = 0
    compute: str = ""
    driver: str = ""
    node: str = ""  # the cluster node it is on ("": this server's own machine)

    @property
    def is_gpu(self) -> bool:
        return self.library != "CPU"

    @property
    def max_tensor(self) -> int:
        """The largest tensor its ggml backend takes (0: no known limit).
        ggml-vulkan refuses an operation with a tensor past the device's
        storage buffer range; Mesa's lavapipe (llvmpipe) has 128 MiB, as its
        measured placements show (tests/memory/test_memory.py)."""
        if self.library == "Vulkan" and self.description.startswith("llvmpipe"):
            return LAVAPIPE_MAX_TENSOR
        return 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


LAVAPIPE_MAX_TENSOR = 1 << 27


def gpu_max_tensor(gpus: list[DeviceInfo]) -> int:
    """The tightest tensor limit of ``gpus`` (0: none known)."""
    return min((d.max_tensor for d in gpus if d.max_tensor), default=0)


@dataclass(frozen=True)
class NodeInfo:
    """A machine devices are on: this server's own (id "") or a cluster node."""

    id: str
    name: str  # what the sidebar shows: a host name, or a node's address
    address: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SystemInfo:
    """Host memory (bytes) and CPU threads."""

    total_memory: int
    free_memory: int
    free_swap: int
    threads: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def without_our_use(device: DeviceInfo, ours: int) -> DeviceInfo:
    """``device`` with free memory no more than its total less what our runners
    hold on it (Ollama's rule). A driver may report allocations late, or never:
    lavapipe reports its whole heap free however much is allocated. Either way
    two models must not be placed in the same bytes. A device that reports no
    total is left as it is."""
    if device.total_memory <= 0 or ours <= 0:
        return device
    free = min(device.free_memory, max(0, device.total_memory - ours))
    return replace(device, free_memory=free)


def device_sort_key(device: DeviceInfo) -> tuple[int, int, str]:
    """Discrete GPUs first, then integrated GPUs, then CPU; most free memory first."""
    rank = 2 if not device.is_gpu else (1 if device.integrated else 0)
    return (rank, -device.free_memory, device.id)


def sort_devices(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    return sorted(devices, key=device_sort_key)


def serving_gpus(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    """The GPUs a model may be placed on: those of the best GPU's library, in
    sort order. A runner loads one backend's devices, so this is the one place
    that decides which GPU library is in use."""
    gpus = [d for d in sort_devices(devices) if d.is_gpu]
    return [d for d in gpus if d.library == gpus[0].library] if gpus else []


def on_node(node: str, device_id: str) -> str:
    """A device id unique across nodes: ``node/id`` (just ``id`` on this
    server's own machine, so nothing changes without a cluster)."""
    if not node or device_id.startswith(f"{node}/"):
        return device_id
    return f"{node}/{device_id}"


def node_devices(devices: list[DeviceInfo], node: str) -> list[DeviceInfo]:
    return [d for d in devices if d.node == node]


def nodes_by_free(devices: list[DeviceInfo]) -> list[str]:
    """The nodes in the order a model tries them: most free memory on the
    serving GPUs first, then the node id (one node: just that one)."""
    nodes = sorted({d.node for d in devices})
    free = {n: sum(d.free_memory for d in serving_gpus(node_devices(devices, n))) for n in nodes}
    return sorted(nodes, key=lambda n: (-free[n], n))
