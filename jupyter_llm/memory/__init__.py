"""Memory estimates and layouts: pure functions of ``ModelInfo``, options and devices."""

from jupyter_llm.memory.estimate import Estimate, EstimateOptions, estimate
from jupyter_llm.memory.layout import (
    CPU,
    MIN_GPU_BYTES,
    Allocation,
    CannotAllocateForced,
    DoesNotFit,
    GpuSlot,
    LayoutFailure,
    NeedsSystemMemory,
    Placement,
    plan_layout,
)
from jupyter_llm.memory.model_info import ModelInfo

__all__ = [
    "CPU",
    "MIN_GPU_BYTES",
    "Allocation",
    "CannotAllocateForced",
    "DoesNotFit",
    "Estimate",
    "EstimateOptions",
    "GpuSlot",
    "LayoutFailure",
    "ModelInfo",
    "NeedsSystemMemory",
    "Placement",
    "estimate",
    "plan_layout",
]
