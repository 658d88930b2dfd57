"""Speculative decoding by prompt lookup (issue 26 item 2): drafts checked in
the batch step must change nothing the client sees (greedy tokens, text,
stops, logprobs, limits, grammars, context shifts), only how many positions
one decode computes. Engine tests run in process and count tokens, never time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from cores import cores
from engine_run import EngineRun as Run
from rewrite_prompt import REWRITE_PROMPT

from jupyter_llm.runner import draft_policy as policy
from jupyter_llm.runner.draft_policy import (
    MAX_LENGTH,
    Window,
    after_draft,
    draft_size,
    may_draft,
    next_length,
)
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.step_costs import StepCosts

PROMPTS = ["hello world hello world hello", "the cat sat on the mat and the cat sat", "abc"]


# -- the policy, pure ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("wanted", "budget", "room", "size"),
    [
        (4, -1, 100, 4),  # no num_predict: as asked
        (4, 3, 100, 2),  # two more tokens after the one being decoded
        (4, 1, 100, 0),  # the token being decoded is the last allowed
        (4, 0, 100, 0),
        (8, -1, 3, 3),  # the context or the batch has room for three
        (8, -1, 0, 0),  # a full context: no draft (a shift comes first)
        (0, -1, 100, 0),  # draft_num_predict 0: off
    ],
)
def test_draft_size(wanted, budget, room, size):
    assert draft_size(wanted, budget, room) == size


@pytest.mark.parametrize(
    ("window", "drafted", "accepted", "generated", "after"),
    [
        (Window(), 4, 0, 5, Window(1, 0)),  # too few drafts to judge yet; one token judged
        (Window(), 16, 3, 5, Window(4, 3)),  # up to the first rejected token only
        (Window(8, 1), 4, 4, 20, Window(0, 0)),  # 5 of 12: pays, a new window
        (Window(10, 0), 4, 1, 20, Window(0, 0, 20 + policy.PAUSE_TOKENS, 1)),  # 1 of 12: off
        (Window(11, 0, 0, 1), 4, 0, 90, Window(0, 0, 90 + 2 * policy.PAUSE_TOKENS, 2)),
        (Window(11, 0, 0, 9), 4, 0, 90, Window(0, 0, 90 + policy.MAX_PAUSE_TOKENS, 10)),
        (Window(0, 0), 16, 4, 20, Window(5, 4)),  # a long draft's rejected tail stops nothing
    ],
)
def test_after_draft(window, drafted, accepted, generated, after):
    assert after_draft(window, drafted, accepted, generated) == after


@pytest.mark.parametrize(
    ("window", "generated", "drafts"),
    [(Window(), 0, True), (Window(0, 0, 52, 1), 51, False), (Window(0, 0, 52, 1), 52, True)],
)
def test_may_draft(window, generated, drafts):
    assert may_draft(window, generated) is drafts


def test_a_sequence_that_never_matches_stops_drafting_then_retries():
    window, generated, drafted_at = Window(), 0, []
    while generated < 400:
        if may_draft(window, generated):
            drafted_at.append(generated)
            window = after_draft(window, 4, 0, generated + 1)
        generated += 1
    # twelve drafts, a pause of 32, twelve, a pause of 64, ... not one per token
    assert len(drafted_at) <= 60
    judged = policy.JUDGE_AFTER
    assert drafted_at[: judged + 1] == [*range(judged), judged + policy.PAUSE_TOKENS]


@pytest.mark.parametrize(
    ("shadow", "drafted", "accepted", "cost", "after", "resume"),
    [
        (policy.Shadow(), 4, 1, 0.5, policy.Shadow(2, 1, 2.0), False),  # too few to judge
        (policy.Shadow(4, 4, 2.0), 4, 4, 0.5, policy.Shadow(), True),  # 8 of 8, owing 4: pays
        # 6 of 8 accepted but owing 5.6 steps' time: 6 < 1.25 x 5.6, no
        (policy.Shadow(4, 3, 2.8), 4, 3, 0.7, policy.Shadow(), False),
        (policy.Shadow(6, 1, 0.0), 4, 1, None, policy.Shadow(), False),  # 2 of 8: under MIN_RATE
        (policy.Shadow(6, 3, 0.0), 4, 1, None, policy.Shadow(), True),  # 4 of 8, cost unknown
    ],
)
def test_after_shadow(shadow, drafted, accepted, cost, after, resume):
    assert policy.after_shadow(shadow, drafted, accepted, cost) == (after, resume)


def test_a_shadowed_pause_lasts_until_resumed():
    window = policy.paused(Window(), 10)
    assert not may_draft(window, 10**6, shadowed=True)  # no timed probe
    assert may_draft(window, 10**6)  # a draft model's pause runs out
    assert may_draft(policy.resumed(window), 11, shadowed=True)
    assert policy.resumed(window).stops == window.stops


@pytest.mark.parametrize(
    ("length", "drafted", "accepted", "after"),
    [
        (4, 4, 4, 8),  # accepted whole: doubled
        (8, 8, 8, 16),
        (16, 16, 16, MAX_LENGTH),  # never past the option's bound
        (12, 12, 12, MAX_LENGTH),
        (4, 4, 3, 2),  # a rejection: halved
        (16, 16, 0, 8),
        (1, 1, 0, 1),  # never below one token
        (8, 3, 3, 8),  # cut short by the lookup or the limits: says nothing, unchanged
        (8, 3, 1, 4),  # but a rejection in it still halves
        (1, 1, 1, 2),  # draft_num_predict 1 grows too
    ],
)
def test_next_length(length, drafted, accepted, after):
    assert next_length(length, drafted, accepted) == after


@pytest.mark.parametrize(
    ("length", "drafted", "accepted", "cut", "after"),
    [
        (4, 3, 3, 3, 8),  # cut to 3 by its cost, accepted whole: as if full
        (8, 7, 7, 7, 16),
        (16, 15, 15, 15, MAX_LENGTH),
        (4, 2, 2, 3, 4),  # the lookup had fewer than the cut: says nothing
        (4, 3, 1, 3, 2),  # a rejection halves the length, not the cut
        (4, 3, 3, 0, 4),  # not cut (the limits): unchanged, as before
    ],
)
def test_next_length_of_a_draft_cut_by_its_cost(length, drafted, accepted, cut, after):
    assert next_length(length, drafted, accepted, cut) == after


def test_the_length_is_bounded_by_the_option_bound():
    from jupyter_llm.request.limits import DRAFT_TOKENS

    assert MAX_LENGTH == DRAFT_TOKENS.value == 16
    length = 1
    for _ in range(10):
        length = next_length(length, length, length)
    assert length == MAX_LENGTH


# -- the engine, on a generated model ------------------------------------------------------
def run_all(engine: Engine, *runs: Run) -> None:
    steps = 0
    while engine.busy:
        engine.step()
        steps += 1
        assert steps < 10_000
    for r in runs:
        assert not r.errors and r.done is not None


def solo(engine: Engine, prompt: str, **options: Any) -> Run:
    run = Run(engine, prompt, **options)
    run_all(engine, run)
    return run


def cells_match(engine: Engine) -> None:
    """Every slot's token record is exactly what its KV cells hold."""
    for slot in engine.slots:
        top = llama_cpp.llama_memory_seq_pos_max(engine.memory, slot.index)
        assert top == len(slot.cached) - 1, (slot.index, top, len(slot.cached))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_is_identical_with_and_without_drafts(engine, prompt):
    plain = solo(engine, prompt, num_predict=80, draft_num_predict=0)
    assert plain.done.draft_tokens == 0
    for k in (1, 4, 16):
        spec = solo(engine, prompt, num_predict=80, draft_num_predict=k)
        assert spec.done.context == plain.done.context  # token ids
        assert spec.output == plain.output
        assert spec.done.eval_count == 80
        assert 0 < spec.done.draft_accepted <= spec.done.draft_tokens
        cells_match(engine)


def test_the_default_drafts(engine):
    run = Run(engine, PROMPTS[0], num_predict=60)
    assert run.job.options.get("draft_num_predict") is None
    run_all(engine, run)
    assert run.done.draft_accepted > 20


def test_drafts_are_checked_beside_other_sequences_in_one_decode(engine):
    alone = {p: solo(engine, p, num_predict=50, draft_num_predict=0).done.context for p in PROMPTS}
    decodes = []
    real = llama_cpp.llama_decode

    def counted(ctx, batch):
        decodes.append(batch.n_tokens)
        return real(ctx, batch)

    llama_cpp.llama_decode = counted
    try:
        runs = [
            Run(engine, p, num_predict=50, draft_num_predict=4 * (i % 2))
            for i, p in enumerate(PROMPTS)
        ]
        run_all(engine, *runs)
    finally:
        llama_cpp.llama_decode = real
    assert [r.done.context for r in runs] == [alone[p] for p in PROMPTS]
    assert runs[1].done.draft_accepted > 0 and runs[0].done.draft_tokens == 0
    assert len(decodes) <= 51  # one decode per step for all three: no extra pass for drafts
    assert max(decodes[1:]) > 3  # three next tokens and a draft in one batch
    cells_match(engine)


def test_the_draft_length_adapts_within_its_bound(engine):
    """draft_num_predict 1 is a starting length: drafts accepted whole grow
    it, never past 16 drafted tokens beside the sequence's next token."""
    prompt = PROMPTS[0] + solo(engine, PROMPTS[0], num_predict=40, draft_num_predict=0).output
    plain = solo(engine, prompt, num_predict=60, draft_num_predict=0)
    decodes = []
    real = llama_cpp.llama_decode

    def counted(ctx, batch):
        if all(batch.logits[i] for i in range(batch.n_tokens)):  # a step, not a prompt chunk
            decodes.append(batch.n_tokens)
        return real(ctx, batch)

    llama_cpp.llama_decode = counted
    try:
        spec = solo(engine, prompt, num_predict=60, draft_num_predict=1)
    finally:
        llama_cpp.llama_decode = real
    assert spec.done.context == plain.done.context
    steps = decodes
    assert max(steps) > 2  # grew past its start of one drafted token
    assert max(steps) <= 1 + MAX_LENGTH
    assert len(steps) < 60 // 2  # more than two tokens a step on average
    cells_match(engine)


def test_a_paused_sequence_drafts_again_when_its_shadow_would_pay(engine):
    """Prompt lookup's drafts are free to make: a paused sequence keeps
    making them without decoding them, and drafts again as soon as they
    would have paid, however long its pause was to run."""
    plain = solo(engine, PROMPTS[0], num_predict=80, draft_num_predict=0)
    run = Run(engine, PROMPTS[0], num_predict=80)
    seq = None
    while seq is None or seq.drafting is None:
        engine.step()
        seq = next((s.seq for s in engine.slots if s.seq is not None), None)
    seq.drafting.window = Window(0, 0, 10**6, 5)  # a pause that would outlive the answer
    drafted = seq.drafting.drafted
    run_all(engine, run)
    assert run.done.context == plain.done.context
    assert run.done.draft_tokens > drafted  # resumed by its shadow, long before 10**6 tokens
    assert run.done.draft_accepted > 20
    cells_match(engine)


def test_seeded_sampling_is_the_same_with_drafts(engine):
    options = {"temperature": 0.7, "seed": 11, "num_predict": 60}
    plain = solo(engine, PROMPTS[1], draft_num_predict=0, **options)
    spec = solo(engine, PROMPTS[1], draft_num_predict=4, **options)
    assert spec.done.context == plain.done.context
    assert spec.done.draft_tokens > 0


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_num_predict_is_never_passed(engine, n):
    plain = solo(engine, PROMPTS[0], num_predict=n, draft_num_predict=0)
    spec = solo(engine, PROMPTS[0], num_predict=n, draft_num_predict=16)
    assert spec.done.eval_count == n and spec.done.context == plain.done.context
    cells_match(engine)


def test_a_stop_inside_an_accepted_draft_ends_the_text_there(engine):
    # a prompt that holds the model's own answer: drafts are accepted from the first token
    prompt = PROMPTS[0] + solo(engine, PROMPTS[0], num_predict=30, draft_num_predict=0).output
    text = solo(engine, prompt, num_predict=40, draft_num_predict=0).output
    stop = text[9:12]
    cut = text.index(stop)
    spec = solo(engine, prompt, num_predict=40, stop=[stop], draft_num_predict=8)
    base = solo(engine, prompt, num_predict=40, stop=[stop], draft_num_predict=0)
    assert spec.output == base.output == text[:cut]
    assert spec.done.done_reason == "stop" and spec.done.draft_accepted > 0
    assert spec.done.context == base.done.context
    cells_match(engine)


def test_logprobs_one_entry_per_emitted_token(engine):
    plain = solo(engine, PROMPTS[1], num_predict=40, logprobs=2, draft_num_predict=0)
    spec = solo(engine, PROMPTS[1], num_predict=40, logprobs=2, draft_num_predict=4)
    assert spec.done.draft_accepted > 0
    assert len(spec.logprobs) == len(plain.logprobs) == 40
    for a, b in zip(spec.logprobs, plain.logprobs, strict=True):
        assert a["token"] == b["token"]
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)


def test_a_grammar_sees_only_the_accepted_tokens(engine):
    grammar = 'root ::= ("ab" | "abc" | "b")+ "."'
    plain = solo(engine, "abcabcab", num_predict=60, grammar=grammar, draft_num_predict=0)
    spec = solo(engine, "abcabcab", num_predict=60, grammar=grammar, draft_num_predict=6)
    assert spec.done.context == plain.done.context
    assert set(spec.output) <= set("abc.") and spec.done.draft_tokens > 0


def test_context_shift_with_drafts(tmp_path: Path):
    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    small = Engine(LoadParams(path=str(path), n_ctx=64, n_batch=32, n_threads=cores(), n_seq=1))
    small.step_costs = StepCosts(small.n_seq, small.n_batch, pinned=0.0)  # not timed
    try:
        # llama.cpp pads n_ctx to 256 cells: three contexts' worth of output shifts
        n = 3 * small.n_ctx
        plain = solo(small, PROMPTS[0], num_predict=n, draft_num_predict=0)
        spec = solo(small, PROMPTS[0], num_predict=n, draft_num_predict=8)
        assert spec.output == plain.output and spec.done.eval_count == n  # so it shifted
        assert spec.done.draft_accepted > 100
        cells_match(small)
        # drafts never ran past the context: the cache held at most n_ctx cells
        assert len(small.slots[0].cached) <= small.n_ctx
    finally:
        small.close()


def test_drafts_beside_a_small_batch_and_many_sequence_ids(tmp_path: Path):
    """num_batch 2 with 4 slots (8 sequence ids): llama.cpp's output rows
    must hold a draft's rows (it asserted before ``n_outputs_max`` was set)."""
    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    small = Engine(LoadParams(path=str(path), n_ctx=256, n_batch=2, n_threads=cores(), n_seq=4))
    small.step_costs = StepCosts(small.n_seq, small.n_batch, pinned=0.0)  # not timed
    try:
        runs = [Run(small, p, num_predict=30, draft_num_predict=4) for p in PROMPTS]
        run_all(small, *runs)
        assert all(r.done.eval_count == 30 for r in runs)
        assert sum(r.done.draft_accepted for r in runs) > 0
        cells_match(small)
    finally:
        small.close()


# -- the real model ------------------------------------------------------------------------


def test_gemma_greedy_output_is_identical_and_drafts_are_accepted(gemma_gguf: Path):
    gemma = Engine(LoadParams(path=str(gemma_gguf), n_ctx=1024, n_threads=cores(), n_seq=2))
    gemma.step_costs = StepCosts(gemma.n_seq, gemma.n_batch, pinned=0.0)  # not timed
    prompt = REWRITE_PROMPT
    try:
        plain = solo(gemma, prompt, num_predict=120, draft_num_predict=0)
        spec = solo(gemma, prompt, num_predict=120, draft_num_predict=4)
        assert spec.done.context == plain.done.context
        assert spec.done.draft_accepted > 40, spec.done
        cells_match(gemma)
    finally:
        gemma.close()
