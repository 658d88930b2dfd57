"""What a verification step costs by its number of rows: the decode time of
one sequence's step with 1 to 17 tokens, every one with its logits (as a
step that verifies a draft of 0 to 16 tokens), after a 300-token context,
in the runner's own engine at the defaults (its threads, its context).

It prints each step's time, a drafted token's cost as a fraction of a
one-token step (what ``runner.step_costs`` measures in a running engine),
and for each draft length the engine might want, the length
``step_costs.cheapest_length`` cuts it to on these costs. On the CPU the
matrix kernels work on tiles of rows, so the cost is not smooth in the
number of rows (measured on Gemma, 2 cores: 8 rows cost less than 5).

``--batch-invariant`` loads as that setting does (q8_0 keys, no repacked
weights, ggml's tiled matmul off: it re-runs itself with the launch's
environment, which ggml reads once per process).

    .venv/bin/python benchmarks/verify_rows.py [--gemma] [--rounds 7] [--batch-invariant]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import llama_cpp
from batch_invariance import decode_ctx, model_path  # beside this file

from jupyter_llm.runner.cpu_threads import default_threads
from jupyter_llm.runner.draft_policy import MAX_LENGTH
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.step_costs import StepCosts, cheapest_length
from jupyter_llm.runner_client.launch import INVARIANT_ENV

CONTEXT = 300  # tokens in the cache before each timed step


def step_ms(engine: Engine, rows: int) -> float:
    """One timed decode of ``rows`` tokens of sequence 0 after the context,
    every row with logits; its cells are dropped after."""
    batch = engine.batch
    for k in range(rows):
        batch.token[k], batch.pos[k], batch.n_seq_id[k] = 1000 + k, CONTEXT + k, 1
        batch.seq_id[k][0], batch.logits[k] = 0, 1
    batch.n_tokens = rows
    t0 = time.perf_counter()
    if llama_cpp.llama_decode(engine.ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    llama_cpp.llama_synchronize(engine.ctx)
    elapsed = time.perf_counter() - t0
    llama_cpp.llama_memory_seq_rm(engine.memory, 0, CONTEXT, -1)
    return elapsed * 1000


def measure(gemma: bool, rounds: int, invariant: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(gemma, tmp)
        params = LoadParams(
            path=str(path), n_ctx=2048, n_threads=default_threads(), batch_invariant=invariant
        )
        engine = Engine(params)
        try:
            context = [(k * 7919) % 20000 + 100 for k in range(CONTEXT)]
            decode_ctx(engine.ctx, engine.vocab, context, 0, every=False)  # in one chunk
            sizes = range(1, MAX_LENGTH + 2)
            times: dict[int, list[float]] = {rows: [] for rows in sizes}
            step_ms(engine, 1)  # warm
            for _ in range(rounds):  # interleaved: drifting load falls on every size
                for rows in sizes:
                    times[rows].append(step_ms(engine, rows))
        finally:
            engine.close()
    costs = StepCosts(1, MAX_LENGTH + 1)
    for rows in sizes:
        for t in times[rows]:
            costs.observe(1, rows, int(t * 1e6))
    mode = "batch-invariant" if invariant else "defaults"
    print(
        f"{'Gemma 3 270M Q4_K_M' if gemma else 'generated f32'}, {mode}, "
        f"{params.n_threads} threads, {CONTEXT} cells, medians of {rounds}"
    )
    print(f"{'rows':>4s} {'step ms':>8s} {'drafted token':>14s} {'length -> cut to':>17s}")
    for rows in sizes:
        drafted = rows - 1
        share = costs.cost(drafted) if drafted else None
        cut = f"{drafted:>6d} -> {cheapest_length(costs, drafted):d}" if drafted else ""
        shown = f"{share:.2f}" if share is not None else "-"
        print(f"{rows:4d} {statistics.median(times[rows]):8.1f} {shown:>14s} {cut:>17s}")


def main() -> None:
    args = sys.argv[1:]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 7
    invariant = "--batch-invariant" in args
    env = dict(INVARIANT_ENV)
    if invariant and any(os.environ.get(k) != v for k, v in env.items()):
        # ggml reads its switches once per process: again, with the launch's
        sys.exit(subprocess.call([sys.executable, *sys.argv], env={**os.environ, **env}))
    measure("--gemma" in args, rounds, invariant)


if __name__ == "__main__":
    main()
