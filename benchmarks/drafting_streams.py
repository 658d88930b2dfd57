"""Speculative decoding beside other streams: a runner at the defaults a
user has (4 sequences sharing one context of the default length) serving
several requests at once, with drafts (``draft_num_predict`` 4) and without,
as the tokens of all of them per second of wall time from the first request
sent to the last answer. A drafted row lengthens the step every stream waits
for, so drafts must pay for all of them (``runner.step_costs``); this is the
measure of that.

The mixes: four and two sampled free-text answers (temperature 0.8, a seed
each), four greedy rewrites of ``benchmarks/speculative.py``'s function,
and two rewrites beside two sampled answers. Two runners of the same model
swap the roles each round (with drafts, without), so neither process's own
speed leans on the ratio; medians of each round's ratio. At the defaults the
answers with drafts are not always the ones without (a token's logits move
in their last bits with what else shares its decode; README), so a sampled
answer's text, and its length, may differ between the two: read the free
text's ratio with that noise (several percent in a single round).
``--batch-invariant`` loads both runners as that setting does: there a
request drafts only while it generates alone (README), so the mixes measure
what that costs; two runners whose caches saw other requests before may
still answer differently (cells freed for room reorder a request's cells).

Target: each free-text mix at least 0.97x the rate without drafts.

    .venv/bin/python benchmarks/drafting_streams.py [--gemma] [--rounds 5] [--batch-invariant]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import replace

from batch_invariance import model_path  # beside this file
from speculative import WORKLOADS

from jupyter_llm.config import Settings
from jupyter_llm.runner.protocol import Complete
from jupyter_llm.runner_client.launch import INVARIANT_ENV, LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with


def sampled(seed: int) -> dict:
    return {"temperature": 0.8, "seed": seed, "repeat_penalty": 1.1}


GREEDY = {"temperature": 0}
# name: [(workload, options, num_predict)], each entry one request sent at once
MIXES = {
    "4 sampled": [("free sampled", sampled(s), 150) for s in (1, 2, 3, 4)],
    "2 sampled": [("free sampled", sampled(s), 150) for s in (5, 6)],
    "4 rewrite": [("rewrite", GREEDY, 200)] * 4,
    "2 rewrite + 2 sampled": [("rewrite", GREEDY, 200)] * 2
    + [("free sampled", sampled(s), 150) for s in (7, 8)],
}
FREE = ("4 sampled", "2 sampled")


async def answer(runner, prompt: str, options: dict) -> dict:
    """The final message of one request."""
    done: dict = {}
    async for batch in runner.complete(Complete(prompt=prompt, options=options)):
        for message in batch:
            if message["type"] == "done":
                done = message
    return done


async def serve(runner, mix: list, draft: int) -> tuple[float, int, int, list]:
    """All of ``mix`` at once: tokens per wall second, drafted, accepted, answers."""
    t0 = time.perf_counter()
    dones = await asyncio.gather(
        *(
            answer(runner, WORKLOADS[w], {**o, "num_predict": n, "draft_num_predict": draft})
            for w, o, n in mix
        )
    )
    wall = time.perf_counter() - t0
    tokens = sum(d["eval_count"] for d in dones)
    answers = [d["context"][len(d["context"]) - d["eval_count"] :] for d in dones]
    drafted = sum(d.get("draft_tokens", 0) for d in dones)
    return tokens / wall, drafted, sum(d.get("draft_accepted", 0) for d in dones), answers


async def main(gemma: bool, rounds: int, invariant: bool) -> int:
    settings = Settings()
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(gemma, tmp)
        model = "Gemma 3 270M Q4_K_M" if gemma else "generated, n_embd 512, 8 layers, f32"
        spec = LoadSpec(path=str(path), n_ctx=settings.context_length, n_seq=settings.num_parallel)
        if invariant:
            spec = replace(spec, batch_invariant=True, env=INVARIANT_ENV)
        pair = [await start_runner_with(spec, load_timeout=120) for _ in range(2)]
        lines, met = [], True
        try:
            for runner in pair:
                await answer(runner, "warm up", {"num_predict": 8})
            for name, mix in MIXES.items():
                ratios, same, counts = [], True, (0, 0)
                for i in range(rounds):
                    plain, drafting = pair if i % 2 == 0 else pair[::-1]
                    rate, _, _, answers = await serve(plain, mix, 0)
                    fast, drafted, accepted, drafted_answers = await serve(drafting, mix, 4)
                    ratios.append(fast / rate)
                    same = same and answers == drafted_answers
                    counts = (counts[0] + drafted, counts[1] + accepted)
                gain = statistics.median(ratios)
                line = f"{name:22s}: {gain:.3f}x  rounds {[round(r, 3) for r in ratios]}"
                line += f"  drafted {counts[0]}, accepted {counts[1]}, same answers: {same}"
                if name in FREE:
                    met = met and gain >= 0.97
                    line += "  (target >= 0.97x)"
                lines.append(line)
                print(line, flush=True)
        finally:
            for runner in pair:
                await runner.close()
    mode = "batch-invariant" if invariant else "defaults"
    print(f"model: {model}, {mode}, {settings.num_parallel} sequences, {rounds} rounds")
    print("with drafts / without, all streams' tokens per wall second (medians):")
    print("\n".join(lines))
    print("targets:", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 5
    sys.exit(asyncio.run(main("--gemma" in args, n, "--batch-invariant" in args)))
