"""What a drafted token costs (runner.step_costs) and what the draft policy
does with it (issue 26 item 1: on 2 CPU cores a drafted row of Gemma costs
about a step, and drafts that cannot pay taxed every free-text stream).
Costs are given here, never timed: the tests count tokens."""

from __future__ import annotations

import pytest
from engine_run import EngineRun

from jupyter_llm.runner import draft_policy as policy
from jupyter_llm.runner.draft_policy import Window, after_draft, paused, worth_drafting
from jupyter_llm.runner.prompt_lookup import PromptLookup
from jupyter_llm.runner.speculative import Drafting
from jupyter_llm.runner.step_costs import MIN_SAMPLES, SAMPLES, StepCosts, priced_length

MS = 1_000_000


def test_the_cost_is_the_extra_time_per_drafted_token_over_a_plain_step():
    costs = StepCosts(max_sequences=4, max_tokens=32)
    for _ in range(3):
        costs.observe(1, 1, 10 * MS)  # one sequence, no draft
    assert costs.cost(2) is None  # no step with two drafted tokens yet
    for _ in range(MIN_SAMPLES):
        assert costs.cost(2) is None
        costs.observe(1, 3, 28 * MS)  # two drafted tokens: 9 ms each, 0.9 of a step
    assert costs.cost(2) == pytest.approx(0.9)
    assert costs.cost(4) is None  # each draft length has its own cost
    for _ in range(MIN_SAMPLES):
        costs.observe(1, 5, 30 * MS)
    assert costs.cost(4) == pytest.approx(0.5)


def test_a_preempted_step_moves_nothing():
    costs = StepCosts(max_sequences=1, max_tokens=8)
    for t in (10, 10, 500, 10):  # the OS took the CPU away once
        costs.observe(1, 1, t * MS)
    assert costs.base_ns(1) == 10 * MS
    for t in (15, 15, 900, 15):
        costs.observe(1, 2, t * MS)
    assert costs.cost(1) == pytest.approx(0.5)


def test_draft_steps_before_any_plain_step_are_not_costed():
    costs = StepCosts(max_sequences=2, max_tokens=8)
    for _ in range(5):
        costs.observe(1, 3, 20 * MS)
    assert costs.cost(2) is None


@pytest.mark.parametrize(
    ("sequences", "tokens", "elapsed"),
    [(0, 1, MS), (5, 5, MS), (1, 33, MS), (2, 1, MS), (1, 1, 0), (1, 1, -MS)],
)
def test_steps_outside_the_bounds_are_ignored(sequences, tokens, elapsed):
    """At most ``max_sequences`` and ``max_tokens`` (the batch) are kept
    apart, so the record's size is bounded; nonsense is dropped."""
    costs = StepCosts(max_sequences=4, max_tokens=32)
    costs.observe(sequences, tokens, elapsed)
    assert not costs._base and not costs._costs


def test_the_record_is_bounded():
    costs = StepCosts(max_sequences=1, max_tokens=4)
    for i in range(10 * SAMPLES):
        costs.observe(1, 1, (i + 1) * MS)
        for k in range(1, 4):
            costs.observe(1, 1 + k, (i + 2) * MS)
    assert len(costs._base[1]) == SAMPLES
    assert set(costs._costs) == {1, 2, 3} and all(len(c) == SAMPLES for c in costs._costs.values())


def test_a_pinned_cost_is_not_measured():
    costs = StepCosts(max_sequences=1, max_tokens=4, pinned=0.25)
    costs.observe(1, 1, MS)
    assert costs.cost(3) == 0.25 and not costs._base


# -- the policy ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cost", "worth"), [(None, True), (0.0, True), (0.79, True), (0.8, False), (2.2, False)]
)
def test_worth_drafting(cost, worth):
    assert worth_drafting(cost) is worth


@pytest.mark.parametrize(
    ("window", "drafted", "accepted", "cost", "after"),
    [
        # 6 of 12 accepted: enough at MIN_RATE, and enough for drafts costing 0.45 a token
        (Window(8, 3, 0, 0, 0.0), 4, 3, 0.45, Window(0, 0)),
        # 6 of 12 accepted, but 12 drafted tokens at 0.7 cost 8.4 tokens' time: off
        (Window(8, 3, 0, 0, 5.6), 4, 3, 0.7, Window(0, 0, 20 + policy.PAUSE_TOKENS, 1)),
        # not measured: MIN_RATE alone, as before
        (Window(8, 3, 0, 0, 0.0), 4, 3, None, Window(0, 0)),
        # owed counts every drafted token, the rejected tail included
        (Window(), 8, 3, 0.5, Window(4, 3, 0, 0, 4.0)),
        # breaking even is not enough: 6 accepted for 5.6 tokens' time owed is under MARGIN
        (Window(8, 3, 0, 0, 4.0), 4, 3, 0.4, Window(0, 0, 20 + policy.PAUSE_TOKENS, 1)),
        # but 6 for 4.6 is
        (Window(8, 3, 0, 0, 3.0), 4, 3, 0.4, Window(0, 0)),
        # a window that already lost MAX_LOSS steps' time stops before it is full
        (Window(2, 0, 0, 0, 2.0), 4, 0, 0.5, Window(0, 0, 20 + policy.PAUSE_TOKENS, 1)),
        (Window(), 16, 3, 0.5, Window(0, 0, 20 + policy.PAUSE_TOKENS, 1)),
        (Window(2, 0, 0, 0, 0.0), 4, 0, 0.4, Window(3, 0, 0, 0, 1.6)),  # not yet
    ],
)
def test_a_window_must_win_back_what_its_drafts_cost(window, drafted, accepted, cost, after):
    assert after_draft(window, drafted, accepted, 20, cost) == after


def drafting(window: Window) -> Drafting:
    return Drafting(PromptLookup([1, 2, 3]), 4, window=window)


def test_a_draft_that_cannot_pay_pauses_drafting():
    costs = StepCosts(1, 32, pinned=1.0)
    state = drafting(Window(1, 1))
    assert priced_length(costs, state, 4, 16, 50) == 0
    assert state.window == paused(Window(1, 1), 50) == Window(0, 0, 50 + policy.PAUSE_TOKENS, 1)


def test_a_costly_length_gives_way_to_a_longer_one_that_may_pay():
    """Measured on Gemma with 2 cores: 2 drafted rows cost 0.9 of a step
    each, 4 rows 0.5 each. A 2-token draft becomes a 4-token one; one
    that the limits keep to 3 tokens cannot pay and pauses."""
    costs = StepCosts(1, 32)
    for _ in range(MIN_SAMPLES):
        costs.observe(1, 1, 10 * MS)
        costs.observe(1, 2, 20 * MS)  # 1 drafted: 1.0
        costs.observe(1, 3, 28 * MS)  # 2 drafted: 0.9 each
        costs.observe(1, 4, 34 * MS)  # 3 drafted: 0.8 each
        costs.observe(1, 5, 30 * MS)  # 4 drafted: 0.5 each
    state = drafting(Window(3, 1))
    assert priced_length(costs, state, 2, 16, 50) == 4
    assert priced_length(costs, state, 4, 16, 50) == 4
    assert priced_length(costs, state, 1, 3, 50) == 0 and state.window.resume_at > 50
    # a length never measured yet may go in (it is measured then)
    assert priced_length(costs, drafting(Window(3, 1)), 5, 16, 50) == 5


def test_the_first_draft_after_a_pause_measures_again():
    costs = StepCosts(1, 32, pinned=1.0)
    state = drafting(Window(0, 0, 40, 1))  # resumed at 40
    assert priced_length(costs, state, 4, 16, 40) == 4
    assert state.window == Window(0, 0, 40, 1)


def test_cheap_drafts_go_in():
    state = drafting(Window(5, 5))
    assert priced_length(StepCosts(1, 32, pinned=0.3), state, 4, 16, 50) == 4
    assert priced_length(StepCosts(1, 32), state, 4, 16, 50) == 4  # not measured yet


# -- in the engine --------------------------------------------------------------------------
def test_drafts_that_cannot_pay_stop_and_the_output_is_the_same(engine):
    """Given a drafted token costing a whole step, a stream that quotes
    itself drafts only a probe now and then; greedy output is unchanged."""
    prompt = "hello world hello world hello world hello"
    options = {"num_predict": 80, "draft_num_predict": 4}
    free = EngineRun(engine, prompt, **options)
    while not free.ended:
        engine.step()
    kept = engine.step_costs
    engine.step_costs = StepCosts(engine.n_seq, engine.n_batch, pinned=1.0)
    try:
        priced = EngineRun(engine, prompt, **options)
        while not priced.ended:
            engine.step()
    finally:
        engine.step_costs = kept
    assert priced.tokens == free.tokens
    assert free.done.draft_tokens > 40
    # a probe at the start and after each pause (32, then 64 tokens): three at most
    assert 0 < priced.done.draft_tokens <= 3 * policy.MAX_LENGTH
    assert priced.done.draft_tokens < free.done.draft_tokens // 2
