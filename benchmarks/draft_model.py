"""A draft model (``LoadParams.draft``, runner/draft_model.py) against prompt
lookup and no speculation, in one process on generated models, greedy, at
the runner's defaults (threads, batch, context): decode rate of the target
(n_embd 512, 8 layers, f32) alone, with prompt lookup (draft_num_predict 4,
the default), and with a small draft model (n_embd 64, 2 layers, the same
tokenizer). Generated weights are random, so two pairs bound what a draft
model can do:

- ``random``: the draft's own random weights; its drafts are almost never
  accepted (the cost of drafting until the policy pauses it);
- ``agree``: both models always like one token best (``DemoModelSpec.favourite``),
  so every draft is accepted (the most a draft this size can give). Prompt
  lookup is measured on the same pair.

Rates are ``eval_count / eval_duration`` of each request, medians over
alternating rounds (the machine may be shared); greedy output is checked to
be the same token ids in every setup.

    .venv/bin/python benchmarks/draft_model.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams

TARGET = {"n_embd": 512, "n_layer": 8, "n_ff": 1536, "n_head": 8, "n_head_kv": 8}
PROMPT = "Write a short story about a lighthouse keeper and the sea. "


def rate(engine: Engine, tokens: int, draft: int) -> tuple[float, list[int], float]:
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens}
    done = engine.complete(
        PROMPT, {**options, "draft_num_predict": draft}, lambda _: None, lambda: False
    )
    accepted = done.draft_accepted / done.draft_tokens if done.draft_tokens else 0.0
    return done.eval_count / (done.eval_duration / 1e9), done.context, accepted


def pair(folder: Path, name: str, favourite: str) -> tuple[Path, Path]:
    target = write_demo_model(
        folder / f"{name}-target.gguf", DemoModelSpec(**TARGET, favourite=favourite)
    )
    draft = write_demo_model(folder / f"{name}-draft.gguf", DemoModelSpec(favourite=favourite))
    return target, draft


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, favourite in (("random", ""), ("agree", "e")):
            target, draft = pair(Path(tmp), name, favourite)
            engines = {
                "alone": (Engine(LoadParams(path=str(target))), 0),
                "lookup": (Engine(LoadParams(path=str(target))), 4),
                "draft model": (Engine(LoadParams(path=str(target), draft=str(draft))), 4),
            }
            rates: dict[str, list[float]] = {k: [] for k in engines}
            accepted: dict[str, float] = {}
            try:
                for _ in range(args.rounds):
                    outputs = set()
                    for key, (engine, k) in engines.items():
                        r, context, accepted[key] = rate(engine, args.tokens, k)
                        rates[key].append(r)
                        outputs.add(tuple(context))
                    assert len(outputs) == 1, "greedy output differs between setups"
            finally:
                for engine, _ in engines.values():
                    engine.close()
            base = statistics.median(rates["alone"])
            for key in engines:
                median = statistics.median(rates[key])
                print(
                    f"{name:6} {key:12} {median:7.1f} tok/s  {median / base:5.2f}x alone"
                    f"  accepted {accepted[key]:.0%}  rounds {[round(x, 1) for x in rates[key]]}"
                )


if __name__ == "__main__":
    main()
