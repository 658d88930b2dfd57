"""A request without a grammar picks its token from the best logits in place
(sequence.NativeSampler, issue 26 item 1: llama.cpp's own call copies all
262k of Gemma's logits first, and a penalty looks each up in its window).
The tokens must be the native call's, greedy and sampled, at the default
options and with penalties that only lower logits; chains the fast path cannot serve keep
the native call. Real Gemma: two fresh engines asked the same requests in
the same order, so their prompt caches match and so do their logits."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_run import EngineRun as Run
from engine_run import finish

from jupyter_llm.request.options import DEFAULT_OPTIONS
from jupyter_llm.runner import sequence
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.step_costs import StepCosts

PROMPT = "Write three sentences about foxes in winter."
CASES = {
    "greedy": {"temperature": 0},
    "defaults, seeded": {"seed": 7},  # temperature 0.8, top_k 40, top_p 0.9
    "top-k 5, min-p": {"seed": 3, "top_k": 5, "min_p": 0.05, "temperature": 1.5},
    "greedy, repeat penalty": {"temperature": 0, "repeat_penalty": 1.3},
    "seeded, repeat penalty": {"seed": 5, "repeat_penalty": 1.1},  # old Ollama's default
    "seeded, frequency, presence": {"seed": 9, "frequency_penalty": 0.5, "presence_penalty": 1},
}


def answers(gguf: Path) -> dict[str, list[int]]:
    engine = Engine(LoadParams(path=str(gguf), n_ctx=512, n_seq=1))
    engine.step_costs = StepCosts(engine.n_seq, engine.n_batch, pinned=0.0)
    try:
        out = {}
        for name, options in CASES.items():
            run = Run(engine, PROMPT, **{**DEFAULT_OPTIONS, **options, "num_predict": 32})
            finish(engine, run)
            assert not run.errors and run.done is not None
            out[name] = run.done.context[-run.done.eval_count :]
        return out
    finally:
        engine.close()


def test_the_fast_pick_is_the_native_calls_token(gemma_gguf: Path, monkeypatch):
    picked: dict[str, int] = {"fast": 0}
    first_pick = sequence.first_pick

    def counted(*args):
        picked["fast"] += 1
        return first_pick(*args)

    monkeypatch.setattr(sequence, "first_pick", counted)
    fast = answers(gemma_gguf)
    assert picked["fast"] >= sum(len(t) for t in fast.values())  # the fast path answered
    monkeypatch.setattr(sequence, "pick_need", lambda opts, n_vocab, n_ctx: 0)  # native
    picked["fast"] = 0
    native = answers(gemma_gguf)
    assert picked["fast"] == 0
    assert fast == native


@pytest.mark.parametrize(
    ("options", "need"),
    [
        ({"temperature": 0}, 1),
        ({}, 40),  # the defaults: top_k 40
        ({"repeat_penalty": 1.1}, 40 + 64),  # and the penalty window
        ({"temperature": 0, "repeat_penalty": 1.1}, 1 + 64),
        ({"frequency_penalty": -0.5}, 0),  # may raise a logit: native
        ({"mirostat": 2}, 0),
        ({"top_k": 0}, 0),  # no top-k: every token matters
    ],
)
def test_which_chains_take_the_fast_pick(options, need):
    from jupyter_llm.runner.constrained import Candidates

    opts = {**DEFAULT_OPTIONS, **options}
    n_vocab = 262_144
    chain = sequence.build_chain(n_vocab, 512, opts)
    need = sequence.pick_need(opts, n_vocab, 512)
    sampler = sequence.NativeSampler(chain, Candidates(1), need)
    try:
        assert sampler.need == need
    finally:
        sampler.free()
