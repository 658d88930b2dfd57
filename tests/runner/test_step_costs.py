"""What a drafted token costs (runner.step_costs) and what the draft policy
does with it (issue 26 item 1: on 2 CPU cores a drafted row of Gemma costs
about a step, and drafts that cannot pay taxed every free-text stream).
Costs are given here, never timed: the tests count tokens."""

from __future__ import annotations

import pytest
from engine_run import EngineRun, finish

from jupyter_llm.runner import draft_policy as policy
from jupyter_llm.runner import speculative
from jupyter_llm.runner.draft_policy import Window, after_draft, paused, worth_drafting
from jupyter_llm.runner.prompt_lookup import PromptLookup
from jupyter_llm.runner.speculative import Drafting
from jupyter_llm.runner.step_costs import (
    MIN_SAMPLES,
    SAMPLES,
    StepCosts,
    cheapest_length,
    cut_beside,
    cut_draft,
    cut_short,
    priced_length,
)

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
    assert not costs._times


def test_the_record_is_bounded():
    costs = StepCosts(max_sequences=1, max_tokens=4)
    for i in range(10 * SAMPLES):
        costs.observe(1, 1, (i + 1) * MS)
        for k in range(1, 4):
            costs.observe(1, 1 + k, (i + 2) * MS)
    assert set(costs._times) == {1, 2, 3, 4}
    assert all(len(t) == SAMPLES for t in costs._times.values())


def test_a_pinned_cost_is_not_measured():
    costs = StepCosts(max_sequences=1, max_tokens=4, pinned=0.25)
    costs.observe(1, 1, MS)
    assert costs.cost(3) == 0.25 and not costs._times


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


# Step times by rows, as benchmarks/verify_rows.py measured Gemma on 2 cores (ms):
# the CPU's kernels work on tiles of rows, so 4, 8, 12 and 16 rows are cheap
ROW_MS = {1: 13.4, 2: 25.5, 3: 30.5, 4: 33.2, 5: 52.1, 6: 55.1, 7: 60.2, 8: 50.6, 9: 71.4}
ROW_MS |= {10: 74.8, 11: 78.4, 12: 64.5, 13: 83.4, 14: 86.3, 15: 89.9, 16: 78.1, 17: 98.8}


def tiled_costs(rows=ROW_MS) -> StepCosts:
    costs = StepCosts(4, 32)
    for _ in range(MIN_SAMPLES):
        for n, ms in rows.items():
            costs.observe(1, n, int(ms * MS))
    return costs


@pytest.mark.parametrize(
    ("drafted", "sequences", "cost"),
    [
        (4, 1, (52.1 - 13.4) / (4 * 13.4)),  # 5 rows alone: 0.72 of a step a token
        (3, 1, (33.2 - 13.4) / (3 * 13.4)),  # 4 rows: 0.49
        # beside 3 sequences, 4 drafted tokens lengthen their 4-row step by 0.13,
        # and each sequence's share of it is a quarter: 0.52 of that share a token
        (4, 4, 4 * (50.6 - 33.2) / (4 * 33.2)),
        (1, 4, 4 * (52.1 - 33.2) / (1 * 33.2)),  # one drafted row there: 2.28, never pays
        (8, 8, None),  # no step of 8 rows without drafts (nor of 16 rows) measured
    ],
)
def test_one_table_of_row_times_prices_every_count_of_sequences(drafted, sequences, cost):
    """Rows cost about the same whether they are drafts of one sequence or
    tokens of several, so steps of one sequence price steps of four; a
    drafted row delays every sequence in the step, so it is priced against
    one sequence's share of the step (issue 26: four sampled streams
    drafting ran 0.87x as fast as without drafts, priced against the whole
    step)."""
    costs = tiled_costs(rows={k: ms for k, ms in ROW_MS.items() if k != 16})
    assert costs.cost(drafted, sequences) == (None if cost is None else pytest.approx(cost))


@pytest.mark.parametrize(
    ("size", "cut"),
    [
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 3),  # 5 rows cost more than 4 rows and one more token: 4 rows
        (5, 3),
        (6, 6),  # 3 makes 1.62 tokens a step's time, 6 1.56: within the margin
        (8, 7),  # 8 rows take less time than 5
        (12, 11),
        (16, 15),
    ],
)
def test_a_draft_is_cut_to_the_cheapest_length_near_it(size, cut):
    assert cheapest_length(tiled_costs(), size) == cut


def test_a_draft_is_never_cut_below_half_nor_made_longer():
    # 4 rows cheap as nothing: still not below half of 16, nor past 2
    rows = {**ROW_MS, 4: 15.0}
    assert cheapest_length(tiled_costs(rows), 16) == 15
    assert cheapest_length(tiled_costs(rows), 2) == 2


def test_a_length_not_measured_yet_is_tried_first():
    costs = StepCosts(1, 32)
    for _ in range(MIN_SAMPLES):
        for n in (1, 5):
            costs.observe(1, n, int(ROW_MS[n] * MS))
    assert cheapest_length(costs, 4) == 3  # 3 not measured: tried, so it will be
    assert cheapest_length(StepCosts(1, 32), 4) == 4  # nothing measured: as asked


def test_a_length_that_cannot_pay_is_not_chosen():
    """The first draft after a pause goes in even where it cannot pay, to
    measure it again (``priced_length``): it is not cut to another length
    that cannot pay either, though that one would lose less."""
    rows = {1: 10.0, 3: 10.0 + 2 * 9.5, 4: 10.0 + 3 * 8.0, 5: 10.0 + 4 * 9.5}
    assert not worth_drafting(0.8)
    assert cheapest_length(tiled_costs(rows), 4) == 4


def test_even_costs_keep_the_length():
    """Where every row costs the same (pinned, or a GPU's nearly free rows),
    a longer draft always makes more per step's time: nothing is cut."""
    for pinned in (0.0, 0.3, 0.79):
        costs = StepCosts(1, 32, pinned=pinned)
        assert [cheapest_length(costs, n) for n in range(1, 17)] == list(range(1, 17))


@pytest.mark.parametrize(
    ("priced", "length", "alone", "after"),
    [
        (4, 4, True, (3, 3)),  # cut, and remembered: accepted whole, it doubles
        (16, 16, True, (15, 15)),
        (8, 4, True, (7, 7)),  # priced longer than the length (a costly length)
        (4, 8, True, (3, 0)),  # the limits kept it below the length: cut, not remembered
        (3, 4, True, (3, 0)),  # nothing to cut
        (4, 4, False, (4, 0)),  # other sequences' rows in the step: as priced
        (0, 4, True, (0, 0)),
    ],
)
def test_cut_draft(priced, length, alone, after):
    assert cut_draft(tiled_costs(), priced, length, alone) == after


@pytest.mark.parametrize(
    ("drafted", "asked", "alone", "kept"),
    [
        (5, 15, True, 3),  # a short loop's copy ran out at 5: 4 rows, not 6
        (7, 15, True, 7),  # 8 rows: cheap already
        (6, 15, True, 6),  # within the margin, as above
        (4, 4, True, 4),  # as many as asked: cut_draft has priced it already
        (5, 15, False, 5),  # other sequences' rows in the step
        (0, 15, True, 0),
    ],
)
def test_a_draft_the_lookup_could_not_fill_is_cut_too(drafted, asked, alone, kept):
    draft = list(range(100, 100 + drafted))
    assert cut_short(tiled_costs(), draft, asked, alone) == draft[:kept]


def test_a_shadow_draft_does_not_explore():
    """A shadow draft is never decoded, so a length not measured yet would
    stay so: it is passed over, not tried."""
    costs = StepCosts(1, 32)
    for _ in range(MIN_SAMPLES):
        for n in (1, 3, 5):  # 2 and 4 drafted measured, 3 not
            costs.observe(1, n, int(ROW_MS[n] * MS))
    assert cut_draft(costs, 4, 4, True) == (3, 3)  # a real draft tries 3
    assert cut_draft(costs, 4, 4, True, False) == (4, 0)  # 2 is no better than 4


def test_a_shorter_draft_must_make_clearly_more():
    """Costs are medians of noisy steps: a length that makes barely more
    per step's time than the one asked for is not cut to."""
    rows = {1: 10.0, 3: 22.0, 4: 10.0 + 3 * 3.16, 5: 10.0 + 4 * 3.75}  # 3 drafted: 2.05, 4: 2.00
    assert cheapest_length(tiled_costs(rows), 4) == 4
    rows = {1: 10.0, 3: 22.0, 4: 10.0 + 3 * 2.5, 5: 10.0 + 4 * 3.75}  # 3: 2.29; 4: 2.00
    assert cheapest_length(tiled_costs(rows), 4) == 3


# -- in the engine --------------------------------------------------------------------------
def run_priced(engine, prompt: str, options: dict, costs: StepCosts) -> EngineRun:
    """One request run to its end on ``engine`` with ``costs`` for its drafts."""
    kept, engine.step_costs = engine.step_costs, costs
    try:
        run = EngineRun(engine, prompt, **options)
        while not run.ended:
            engine.step()
    finally:
        engine.step_costs = kept
    return run


def test_drafts_that_cannot_pay_stop_and_the_output_is_the_same(engine):
    """Given a drafted token costing a whole step, a stream that quotes
    itself drafts only a probe now and then; greedy output is unchanged."""
    prompt = "hello world hello world hello world hello"
    options = {"num_predict": 80, "draft_num_predict": 4}
    free = run_priced(engine, prompt, options, engine.step_costs)
    whole_step = StepCosts(engine.n_seq, engine.n_batch, pinned=1.0)
    priced = run_priced(engine, prompt, options, whole_step)
    assert priced.tokens == free.tokens
    assert free.done.draft_tokens > 40
    # a probe at the start and after each pause (32, then 64 tokens): three at most
    assert 0 < priced.done.draft_tokens <= 3 * policy.MAX_LENGTH
    assert priced.done.draft_tokens < free.done.draft_tokens // 2


class FixedCosts(StepCosts):
    """Costs that the engine's own step times do not move."""

    def __init__(self, measured: StepCosts) -> None:
        super().__init__(1, 32)
        self.table = {k: measured.cost(k) for k in range(1, 17)}

    def cost(self, drafted: int, sequences: int = 1, estimate: bool = False) -> float | None:
        return self.table.get(drafted)


def test_drafts_cut_to_cheap_row_counts_still_grow(engine, monkeypatch):
    """Given costs that make 4, 8 and 16 rows the cheap steps, a stream that
    quotes itself drafts 3 and 7 tokens, not 4 and 8 (and never 16, where
    the lookup has that many): a cut draft accepted whole still doubles the
    length, up to the bound. Greedy output is unchanged."""
    prompt = "hello world hello world hello world hello"
    options = {"num_predict": 80, "draft_num_predict": 4}
    plain = run_priced(engine, prompt, options, engine.step_costs)
    drafted: list[int] = []
    lengths: list[int] = []
    settle = speculative.settle

    def counted(engine, seq, n, matched):
        settle(engine, seq, n, matched)
        drafted.append(n)
        lengths.append(seq.drafting.length)

    monkeypatch.setattr(speculative, "settle", counted)
    cut = run_priced(engine, prompt, options, FixedCosts(tiled_costs()))
    assert cut.tokens == plain.tokens
    assert drafted[:2] == [3, 7], drafted
    assert max(lengths) == policy.MAX_LENGTH
    assert not {4, 8, 16} & set(drafted), drafted


def run_pair(engine, prompt: str, options: dict, costs: StepCosts) -> list[EngineRun]:
    """Two requests run at once to their ends on ``engine`` with ``costs``."""
    kept, engine.step_costs = engine.step_costs, costs
    try:
        pair = [EngineRun(engine, prompt, **options) for _ in range(2)]
        finish(engine, *pair)
    finally:
        engine.step_costs = kept
    return pair


class FixedTimes(StepCosts):
    """Step times by rows that the engine's own steps do not move."""

    def __init__(self, rows: dict[int, float]) -> None:
        super().__init__(3, 64)
        for _ in range(MIN_SAMPLES):
            for n, ms in rows.items():
                super().observe(1, n, int(ms * MS))

    def observe(self, sequences: int, tokens: int, elapsed_ns: int) -> None:
        pass


def test_drafts_that_pay_alone_but_not_beside_another_stream_are_not_made_there(engine):
    """Two rows cost little more than one, and each row past them 0.8 of a
    step alone: alone a quoting stream's drafts pay (a 4-token draft 0.63
    of a step a token), beside another stream each drafted row lengthens
    their 2-row step by 0.73 of it, which is 1.45 of each stream's share:
    no draft saves time even accepted whole, so none is made there
    (``cut_beside``; priced against the whole step, drafting went on).
    Greedy output is the same either way."""
    rows = {1: 10.0, 2: 11.0} | {n: 11.0 + 8 * (n - 2) for n in range(3, 40)}
    prompt = "hello world hello world hello world hello"
    options = {"num_predict": 80, "draft_num_predict": 4}
    alone = run_priced(engine, prompt, options, FixedTimes(rows))
    pair = run_pair(engine, prompt, options, FixedTimes(rows))
    assert alone.done.draft_tokens > 40
    for run in pair:
        assert run.tokens == alone.tokens
        assert run.done.draft_tokens == 0


def test_a_drafted_token_is_settled_at_what_the_whole_steps_drafts_cost(engine, monkeypatch):
    """Where two streams draft in one step, each one's drafts are judged at
    what all the step's drafted tokens cost a token (8 of them beside 2
    sequences: 0.6 of a stream's share here), not at what its own would
    alone (4 of them: 0.2)."""
    rows = {1: 10.0, 2: 20.0} | {n: 20.0 + 2 * (n - 2) for n in range(3, 7)}
    rows |= {n: 28.0 + 10 * (n - 6) for n in range(7, 40)}
    times = FixedTimes(rows)
    judged: list[tuple[int, int, float | None]] = []
    after_draft = speculative.after_draft

    def recorded(window, drafted, accepted, generated, cost=None):
        judged.append((drafted, engine.shape.drafted, cost))
        return after_draft(window, drafted, accepted, generated, cost)

    monkeypatch.setattr(speculative, "after_draft", recorded)
    prompt = "hello world hello world hello world hello"
    run_pair(engine, prompt, {"num_predict": 40, "draft_num_predict": 4}, times)
    assert times.cost(4, 2) == pytest.approx(0.2) and times.cost(8, 2) == pytest.approx(0.6)
    assert any(own < total for own, total, _ in judged), judged  # both drafted in a step
    for _, total, cost in judged:
        assert cost == pytest.approx(times.cost(total, 2))


@pytest.mark.parametrize(
    ("rows", "estimate", "ms"),
    [
        (4, False, 33.2),  # measured
        (6, False, None),  # not measured, nor estimated
        (6, True, 33.2 + (50.6 - 33.2) / 2),  # on the line from 4 rows to 8
        (10, True, 50.6 + (50.6 - 13.4) / 7 * 2),  # past the longest: the line from the shortest
        (10, False, None),  # chosen only once measured: it goes in, is measured
        (1, True, 13.4),
    ],
)
def test_a_step_of_rows_not_measured_yet_is_read_off_its_neighbours(rows, estimate, ms):
    costs = tiled_costs(rows={1: 13.4, 4: 33.2, 8: 50.6})
    got = costs.time_ns(rows, estimate)
    assert got == (None if ms is None else pytest.approx(ms * MS))


def test_nothing_is_estimated_below_the_counts_measured_nor_past_a_single_one():
    costs = tiled_costs(rows={4: 33.2, 5: 52.1})
    assert costs.time_ns(2, estimate=True) is None  # only counts above
    assert costs.cost(2, 4, estimate=True) is not None  # 6 rows: past 4 and 5
    single = tiled_costs(rows={4: 33.2})
    assert single.time_ns(6, estimate=True) is None  # one count draws no line
    assert single.cost(2, 4, estimate=True) is None


def test_past_the_longest_count_the_line_never_falls():
    """A cheap tile measured last (4 rows cheaper than 3) does not make a
    longer step cheaper than the longest measured."""
    costs = tiled_costs(rows={3: 58.0, 4: 51.1})
    assert costs.time_ns(36, estimate=True) == pytest.approx(51.1 * MS)
    costs = tiled_costs(rows={3: 58.0, 4: 51.1, 8: 71.4})  # then a longer one: the line rises
    assert costs.time_ns(36, estimate=True) == pytest.approx((71.4 + (71.4 - 58.0) / 5 * 28) * MS)


def test_several_streams_long_drafts_past_every_measured_step_are_not_free():
    """Four streams whose long drafts made a 36-row step, longer than any
    measured: judged on the line from the shortest count through the
    longest (here the step's real time within 2 %), not at none, which let
    them draft on (four sampled streams on Gemma, 2 cores)."""
    measured = {1: 20.8, 4: 51.1, 8: 71.4, 12: 105.6, 16: 134.0, 20: 228.7}
    costs = tiled_costs(rows=measured)
    assert costs.time_ns(36, estimate=True) == pytest.approx(
        (228.7 + (228.7 - 20.8) / 19 * 16) * MS
    )
    assert costs.time_ns(36, estimate=True) == pytest.approx(411.3 * MS, rel=0.02)
    cost = costs.cost(32, 4, estimate=True)
    assert cost is not None and cost > 0.8  # no sampled window pays that


def test_an_estimated_cost_prices_a_step_beside_others():
    costs = tiled_costs(rows={1: 13.4, 4: 33.2, 8: 50.6})
    assert costs.cost(2, 4) is None  # a length not measured is tried, to measure it
    assert costs.cost(2, 4, estimate=True) == pytest.approx(4 * (41.9 - 33.2) / (2 * 33.2))


def test_alone_a_draft_is_judged_only_once_its_rows_were_measured():
    """One sequence's drafts make few row counts, each soon measured: until
    then they are not judged at the line's estimate (it paused a greedy
    rewrite more, ``StepCosts.cost``)."""
    costs = tiled_costs(rows={1: 13.4, 4: 33.2, 8: 50.6})
    assert costs.time_ns(6, estimate=True) is not None
    assert costs.cost(5, 1, estimate=True) is None
    assert costs.cost(3, 1, estimate=True) == pytest.approx((33.2 - 13.4) / (3 * 13.4))


def test_drafts_in_steps_of_row_counts_not_measured_are_not_free(engine):
    """Two quoting streams beside each other whose drafts make steps of row
    counts never measured (only 1, 2, 3 and 39 rows were): their drafts are
    priced at the times read off the measured counts (here 1.45 of a
    stream's share a token: no draft saves time, so none is made,
    ``cut_beside``), not at none, which let them draft on."""
    line = {1: 10.0, 2: 11.0} | {n: 11.0 + 8 * (n - 2) for n in (3, 39)}
    prompt = "hello world hello world hello world hello"
    options = {"num_predict": 80, "draft_num_predict": 4}
    pair = run_pair(engine, prompt, options, FixedTimes(line))
    alone = run_priced(engine, prompt, {**options, "draft_num_predict": 0}, engine.step_costs)
    for run in pair:
        assert run.tokens == alone.tokens
        assert run.done.draft_tokens == 0


# Step times by rows of Gemma 3 270M on 2 cores without AVX-512, as a runner
# serving four sampled streams measured them (ms): 6 rows as fast as 4
BESIDE_MS = {1: 20.8, 2: 35.1, 3: 58.0, 4: 51.1, 5: 57.0, 6: 50.9, 7: 89.1, 8: 71.4}
BESIDE_MS |= {9: 110.3, 10: 90.4, 11: 120.6, 12: 105.6, 14: 114.7, 16: 134.0, 18: 148.4}
BESIDE_MS |= {20: 228.7}


@pytest.mark.parametrize(
    ("priced", "length", "drafted", "rate", "after"),
    [
        (4, 4, 0, 0.5, (2, 2)),  # 6 rows as fast as 4: 2 tokens cost nothing
        (4, 4, 2, 0.5, (0, 0)),  # after another's 2: 7 or 8 rows cost more than they save
        (16, 16, 0, 0.9, (2, 2)),  # 16 beside 3 others: 20 rows, 4.5 plain steps
        (16, 16, 0, 0.97, (14, 14)),  # a near-certain quote pays for 18 rows
        (4, 8, 0, 0.5, (2, 0)),  # the limits kept it short: not remembered as cut
        (0, 4, 0, 0.9, (0, 0)),
    ],
)
def test_beside_others_a_draft_is_cut_to_what_saves_the_step_most(
    priced, length, drafted, rate, after
):
    costs = tiled_costs(rows=BESIDE_MS)
    assert cut_beside(costs, priced, length, 4, drafted, rate) == after


def test_beside_others_a_draft_goes_in_uncut_until_its_times_are_known():
    costs = tiled_costs(rows={4: 51.1})  # the plain step only: no line to read
    assert cut_beside(costs, 4, 4, 4, 0, 0.5) == (4, 0)
    assert cut_beside(StepCosts(4, 64, pinned=0.5), 4, 4, 4, 0, 0.5) == (4, 0)


def test_beside_others_a_shorter_draft_may_pay_where_the_asked_one_cannot():
    costs = tiled_costs(rows=BESIDE_MS)
    state = drafting(Window(3, 1))
    assert costs.cost(16, 4) is not None and not worth_drafting(costs.cost(16, 4))
    # 19 rows never measured: tried (``cut_beside`` then cuts it by the line's times)
    assert priced_length(costs, state, 16, 16, 50, sequences=4) == 15
    assert priced_length(costs, state, 4, 4, 50, sequences=4) == 4  # 0.40 a token
    assert priced_length(costs, state, 5, 5, 50, sequences=4) == 4  # 0.93 a token: shorter
    assert state.window == Window(3, 1)  # not paused
    alone = drafting(Window(3, 1))
    assert priced_length(tiled_costs(rows={1: 10.0, 2: 30.0}), alone, 1, 1, 50) == 0


def test_the_rate_counts_drafts_and_probes_to_their_first_rejected_token():
    state = Drafting(PromptLookup([5, 6, 7, 8, 5, 6]), 4)
    assert state.rate == 0.5  # before any
    state.probe, state.probe_at = [7, 8, 5], 0
    speculative.probe(state, [7], 3)  # one seen, as guessed: not settled yet
    assert (state.tries, state.hits) == (0, 0)
    speculative.probe(state, [7, 9], 3)  # the second differs: 2 judged, 1 hit
    assert (state.tries, state.hits) == (2, 1)
    assert state.probe_at == 2 and state.rate == pytest.approx(2 / 4)


def test_beside_another_stream_quoting_streams_draft_only_the_rows_that_cost_nothing(
    engine, monkeypatch
):
    """Two rows cost about one, up to four rows little more, and each row
    past them 0.8 of a step: beside each other two quoting streams draft 2
    tokens a step between them, never a step of more than 4 rows (the
    adaptive length would have grown to 16 each). Greedy output is the
    same as without drafts."""
    rows = {1: 10.0, 2: 11.0, 3: 11.5, 4: 12.0} | {n: 12.0 + 8 * (n - 4) for n in range(5, 40)}
    prompt = "hello world hello world hello world hello"
    options = {"num_predict": 80, "draft_num_predict": 4}
    steps: list[tuple[int, int]] = []  # (sequences, rows) of each step that drafted
    settle = speculative.settle

    def counted(engine, seq, n, matched):
        shape = engine.shape
        steps.append((shape.sequences, shape.sequences + shape.drafted))
        settle(engine, seq, n, matched)

    monkeypatch.setattr(speculative, "settle", counted)
    pair = run_pair(engine, prompt, options, FixedTimes(rows))
    plain = run_priced(engine, prompt, {**options, "draft_num_predict": 0}, engine.step_costs)
    for run in pair:
        assert run.tokens == plain.tokens
    assert sum(run.done.draft_tokens for run in pair) > 20
    beside = [rows for sequences, rows in steps if sequences == 2]
    assert beside and max(beside) <= 4, steps  # alone (the other done) it drafts on
