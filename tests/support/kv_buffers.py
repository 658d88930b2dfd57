"""The KV cache as llama.cpp allocated it in a real runner and as the estimate
counts it, for the tests that hold one against the other (the kv_cache_type
and batch_invariant settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_llm.memory import EstimateOptions, estimate, plan_layout
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

MiB = 1 << 20
LOG_PRECISION = MiB // 200 + 1  # llama.cpp prints each KV buffer in MiB with 2 decimals


def kv_bytes(runner: Any) -> int:
    """The KV buffers a loaded runner reported, summed over its devices."""
    return sum(d.get("kv_cache", 0) for d in runner.measured.values())


async def measured_kv(spec: LoadSpec) -> tuple[int, str]:
    """The KV bytes a runner loaded with ``spec`` allocated, and why its cache
    is f16 ("" when it has the type asked for)."""
    runner = await start_runner_with(spec, load_timeout=120)
    try:
        return kv_bytes(runner), runner.kv_cache_fallback
    finally:
        await runner.close()


def estimated_kv(path: Path, num_ctx: int, kv_type: str, keys: str = "") -> int:
    """The estimate's KV bytes for the GGUF at ``path`` (``keys``: the K type
    where it is not ``kv_type``)."""
    opts = EstimateOptions(num_ctx, kv_type=kv_type, kv_type_k=keys, num_parallel=4)
    layout = plan_layout(estimate(read_model_info(path), opts), [], system_free=1 << 50)
    return layout.allocations[-1].kv_cache
