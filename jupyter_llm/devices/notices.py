"""Idle GPUs explained: what the host shows (NVML, device nodes, the OS) against
what the runner's llama.cpp build can use (its ggml devices). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

# ggml backend registry names that put layers on a GPU
GPU_LIBRARIES = frozenset({"CUDA", "Vulkan", "Metal", "ROCm", "HIP", "SYCL", "MUSA", "CANN"})

FIX = {
    "nvidia": "make lab GPU=cuda",
    "apple": "make lab GPU=metal",
    "other": "make lab GPU=vulkan",
}


@dataclass(frozen=True)
class HostGPU:
    """A GPU the host shows. ``vendor``: "nvidia", "apple" or "other"."""

    vendor: str
    name: str
    source: str  # where it was seen: "nvml", "/proc/driver/nvidia", "/dev/dri", "macOS"


@dataclass(frozen=True)
class Notice:
    kind: str  # "idle_gpu" or "runner_failed"
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def idle_gpu_notices(host: Iterable[HostGPU], ggml_libraries: Iterable[str]) -> list[Notice]:
    """One notice per vendor whose GPUs the host shows while the build has no
    GPU backend at all. A build with any GPU backend uses what it can; ggml
    then lists those devices itself."""
    libraries = set(ggml_libraries)
    if libraries & GPU_LIBRARIES:
        return []
    by_vendor: dict[str, list[HostGPU]] = {}
    for gpu in host:
        by_vendor.setdefault(gpu.vendor if gpu.vendor in FIX else "other", []).append(gpu)
    notices = []
    for vendor in ("nvidia", "apple", "other"):
        gpus = by_vendor.get(vendor)
        if not gpus:
            continue
        names = ", ".join(sorted({g.name for g in gpus}))
        built = ", ".join(sorted(libraries)) or "no backend"
        notices.append(
            Notice(
                kind="idle_gpu",
                message=(
                    f"{len(gpus)} GPU(s) seen ({names}) but the runner's llama.cpp build "
                    f"has only {built}: models run on the CPU"
                ),
                fix=FIX[vendor],
            )
        )
    return notices


def runner_notice(python: str, error: str) -> Notice:
    """The runner interpreter could not list devices (bad ``python`` setting,
    no llama_cpp there, a crashing backend)."""
    return Notice(
        kind="runner_failed",
        message=f"device discovery with the runner interpreter {python} failed: {error}",
        fix="set the python setting (c.LLMExtension.python or JUPYTER_LLM_PYTHON) "
        "to an interpreter with jupyter_llm and llama_cpp installed",
    )
