"""The thread count's rules (runner.thread_tuning) over simulated step times:
a machine whose cores another process takes and gives back; and an engine
that follows them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import llama_cpp
import pytest

from jupyter_llm.runner.engine import Engine, thread_tuner
from jupyter_llm.runner.protocol import Done, LoadParams
from jupyter_llm.runner.sequence import Job
from jupyter_llm.runner.step_costs import StepCosts
from jupyter_llm.runner.thread_tuning import (
    CALLED_PROBE_STEPS,
    CPU_CHECK,
    FIRST_PROBE,
    MAX_INTERVAL,
    MAX_INTERVAL_BELOW,
    MAX_SHAPES,
    PROBE_STEPS,
    CpuWatch,
    ThreadTuner,
    free_cores,
)

MS = 1_000_000
# Gemma 3 270M on 2 cores (the module's figures): ms a token at 1 and 2 threads
QUIET = {1: 24.4 * MS, 2: 15.2 * MS}
BUSY = {1: 23.8 * MS, 2: 41.0 * MS}  # one core held by another process


def run(
    tuner: ThreadTuner,
    steps: int,
    times: Callable[[int, int], float],
    sequences: int = 1,
    drafted: int | Callable[[int], int] = 0,
    draft_cost: float = 0.5,
    tick: Callable[[float], None] | None = None,
) -> list[int]:
    """The count each step ran at; ``times(count, step)`` is its time (a
    step's ``drafted`` tokens, a number or one per step, cost ``draft_cost``
    of a step each; none while it measures, as the engine drafts nothing
    then). ``tick`` is told each step's time before the tuner sees it."""
    counts = []
    for step in range(steps):
        running = tuner.threads
        counts.append(running)
        extra = 0 if tuner.measuring else drafted(step) if callable(drafted) else drafted
        cost = times(running, step) * (1 + draft_cost * extra)
        if tick is not None:
            tick(cost)
        tuner.observe(sequences, sequences + extra, int(cost))
    return counts


def test_a_quiet_machine_keeps_every_core_and_probes_ever_less() -> None:
    tuner = ThreadTuner(2)
    counts = run(tuner, 20_000, lambda n, _: QUIET[n])
    assert tuner.count == 2
    probe_steps = counts.count(1)
    probes = probe_steps // PROBE_STEPS
    assert probe_steps == probes * PROBE_STEPS  # each probe ran its whole length
    # intervals 128, 256, ... 2048, then 2048 each: 4 + (20000 - 3840) / 2048 probes
    assert 10 <= probes <= 13
    assert tuner.interval == MAX_INTERVAL
    # what the probes cost, in steps of the faster count's time
    lost = probe_steps * (QUIET[1] - QUIET[2]) / QUIET[2]
    assert lost / len(counts) < 0.002
    assert counts[:FIRST_PROBE] == [2] * FIRST_PROBE


def test_a_neighbour_that_starts_moves_it_to_fewer_threads_within_a_few_steps() -> None:
    tuner = ThreadTuner(2)
    start = 5_000  # long settled: probes are far apart by then
    counts = run(tuner, start + 40, lambda n, step: QUIET[n] if step < start else BUSY[n])
    assert tuner.interval == FIRST_PROBE  # a probe that wins sets the probes' pace again
    moved = counts.index(1, start)
    assert moved - start <= 6 + PROBE_STEPS  # seen slower, then the probe's first half
    assert counts[-20:] == [1] * 20


def test_when_the_neighbour_leaves_a_probe_finds_every_core_again() -> None:
    tuner = ThreadTuner(2)
    busy = range(1_000, 3_000)
    counts = run(tuner, 4_000, lambda n, step: BUSY[n] if step in busy else QUIET[n])
    assert counts[2_000:2_010] == [1] * 10  # while it is busy
    back = counts.index(2, busy.stop)
    assert back - busy.stop <= MAX_INTERVAL_BELOW + PROBE_STEPS
    probes_while_busy = sum(  # a probe up now and then, each PROBE_STEPS long
        1 for i in range(busy.start + 100, busy.stop) if counts[i] == 2 and counts[i - 1] == 1
    )
    assert 5 <= probes_while_busy <= 9  # every 256 steps at most
    assert counts[-100:] == [2] * 100
    assert tuner.count == 2


def test_probes_go_both_ways_between_one_and_the_maximum() -> None:
    tuner = ThreadTuner(4)

    def four_cores_one_held(n: int, _: int) -> float:
        return {1: 40, 2: 22, 3: 15, 4: 38}[n] * MS  # 3 threads fit the free cores

    counts = run(tuner, 3_000, four_cores_one_held)
    assert tuner.count == 3
    assert set(counts) <= {2, 3, 4}
    assert counts[-10:] == [3] * 10


@pytest.mark.parametrize("sequences", [1, 3])
def test_steps_are_compared_only_for_as_many_sequences(sequences: int) -> None:
    tuner = ThreadTuner(2)
    # a step of 3 sequences takes longer at any count: only like is compared with like
    scale = {1: 1.0, 3: 1.6}[sequences]
    counts = run(tuner, 600, lambda n, _: BUSY[n] * scale, sequences, sequences)
    assert tuner.count == 1
    assert counts[-10:] == [1] * 10


def test_a_probe_whose_sequences_changed_between_its_halves_gives_no_verdict() -> None:
    tuner = ThreadTuner(2)
    run(tuner, FIRST_PROBE, lambda n, _: QUIET[n])  # a probe due
    assert tuner.measuring and tuner.threads == 2  # it times the count first
    run(tuner, PROBE_STEPS, lambda n, _: QUIET[n])
    assert tuner.measuring and tuner.threads == 1  # then the one probed
    run(tuner, PROBE_STEPS, lambda n, _: 1 * MS, sequences=2)  # a second stream came
    assert (tuner.measuring, tuner.count) == (False, 2)
    assert tuner.interval == FIRST_PROBE  # no verdict: the same wait again


def test_a_stream_that_drafts_is_probed_without_drafts() -> None:
    """A stream whose every step drafts: the probe's steps are of one token
    (the engine drafts nothing while the tuner measures), so it has a
    verdict; the drafting steps' shapes tell when a neighbour started."""
    tuner = ThreadTuner(2)
    quiet, busy, after = (
        run(tuner, 1_000, lambda n, _: QUIET[n], drafted=4),
        run(tuner, 1_000, lambda n, _: BUSY[n], drafted=4),
        run(tuner, 1_000, lambda n, _: QUIET[n], drafted=4),
    )
    assert quiet[-100:].count(2) >= 100 - 2 * PROBE_STEPS
    assert busy[:50].count(1) > 30  # moved within a few steps of the neighbour
    assert busy[-100:].count(1) >= 100 - 2 * PROBE_STEPS
    assert tuner.count == 2 and after[-50:].count(2) >= 50 - 2 * PROBE_STEPS  # back


@pytest.mark.parametrize("maximum", [0, 1])
def test_one_core_is_left_alone(maximum: int) -> None:
    tuner = ThreadTuner(maximum)
    assert set(run(tuner, 1_000, lambda n, _: QUIET.get(n, 1))) == {1}


def test_a_noisy_quiet_machine_does_not_move_it() -> None:
    """Preempted steps (every 7th at 3x) are in both counts' medians alike."""
    tuner = ThreadTuner(2)
    counts = run(tuner, 8_000, lambda n, step: QUIET[n] * (3 if step % 7 == 0 else 1))
    assert tuner.count == 2
    assert counts.count(1) / len(counts) < 0.01


# -- in an engine -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "tuned"),
    [
        ({"n_threads": 2, "adapt_threads": True}, True),  # the default count (runner.serve)
        ({"n_threads": 2}, False),  # num_thread or JUPYTER_LLM_NUM_THREADS: kept as set
        ({"n_threads": 1, "adapt_threads": True}, False),  # nothing to take away
        ({"n_threads": 2, "adapt_threads": True, "n_gpu_layers": -1}, False),  # on a GPU
    ],
)
def test_which_engines_tune_their_threads(params, tuned) -> None:
    assert (thread_tuner(LoadParams(path="m.gguf", **params)) is not None) == tuned


def greedy_with_threads(engine: Engine, tokens: int) -> tuple[str, list[int], Done]:
    """A greedy answer without drafts, the context's thread count at each
    step, and the request's ``done``."""
    text: list[str] = []
    done: list[Done] = []
    errors: list[Exception] = []
    options = {"temperature": 0, "num_predict": tokens, "draft_num_predict": 0}
    prompt = engine.model.prompt_tokens("hello")
    engine.submit(Job(1, prompt, options, text.append, done.append, errors.append))
    counts = []
    while not done and not errors:
        engine.step()
        counts.append(llama_cpp.llama_n_threads(engine.ctx))
        if engine.threads is not None:
            assert counts[-1] == engine.threads.threads  # the tuner's count, every step
    assert not errors, errors
    return "".join(text), counts, done[0]


def test_an_engine_probes_fewer_threads_and_answers_the_same(demo_gguf: Path) -> None:
    """The probe is due after FIRST_PROBE steps whatever the times are; which
    count wins depends on this machine, so only what does not is asserted."""
    answers = {}
    for adapt in (True, False):
        params = LoadParams(path=str(demo_gguf), n_ctx=512, n_threads=2, adapt_threads=adapt)
        engine = Engine(params)
        try:
            answers[adapt], counts, done = greedy_with_threads(
                engine, FIRST_PROBE + 3 * PROBE_STEPS
            )
            assert done.threads in (1, 2)  # the count as it ended (a probe may end after it)
        finally:
            engine.close()
        if adapt:
            assert 1 in counts[: FIRST_PROBE + PROBE_STEPS + 2]  # a probe at one thread ran
            assert counts[0] == 2
        else:
            assert set(counts) == {2}
    assert answers[True] == answers[False]


def test_a_count_that_wins_measures_what_drafts_cost_anew(demo_gguf: Path) -> None:
    """A probe is caught with three of its first half's steps made to look
    10 s long, so the real steps at one thread win whatever this machine's
    speed; the drafts' costs measured at the old count are dropped with it
    (a pinned cost is kept)."""
    params = LoadParams(path=str(demo_gguf), n_ctx=512, n_threads=2, adapt_threads=True)
    engine = Engine(params)
    try:
        tuner = engine.threads
        assert tuner is not None
        tuner.probing, tuner.phase, tuner.probe_steps = 1, 1, PROBE_STEPS - 1
        tuner.timed = {1: {(1, 1): [10_000 * MS] * (PROBE_STEPS - 1)}, 2: {}}
        engine.step_costs = StepCosts(engine.n_seq, engine.n_batch, pinned=0.25)
        before = engine.step_costs
        _, counts, done = greedy_with_threads(engine, 2 + 2 * PROBE_STEPS)
        assert tuner.count == 1 and counts[-1] == 1
        assert done.threads == 1  # the count it moved to, for /api/ps
        assert engine.step_costs is not before and engine.step_costs.pinned == 0.25
    finally:
        engine.close()


def test_the_shapes_remembered_are_bounded() -> None:
    tuner = ThreadTuner(2)
    for tokens in range(1, 500):  # 256 streams drafting every length: one shape each
        tuner.observe(1, tokens, 5 * MS)
        tuner.phase = tuner.probing = 0  # only the count's own steps here
    assert len(tuner.times) <= MAX_SHAPES and len(tuner.settled) <= MAX_SHAPES
    assert (1, 499) in tuner.times  # the newest kept


class Cpus:
    """A machine's CPU times as the runner reads them: ``neighbours``
    processes spinning beside the tuner's ``threads``, all sharing
    ``len(cpus)`` CPUs alike; time moves as the steps run (``tick``) or as
    the runner waits for work (``wait``)."""

    def __init__(self, tuner: ThreadTuner, cpus: int) -> None:
        self.tuner, self.n = tuner, cpus
        self.neighbours = 0
        self.idle = self.total = 0.0
        self.own = self.wall = self.waited = 0.0
        self.filled = 1.0  # of their cores' time the runner's threads use when they run

    def watch(self, waits: bool = False) -> CpuWatch:
        """The watch; ``waits``: with the kernel's count of run-queue waits."""
        read_wait = self.read_wait if waits else lambda: None
        return CpuWatch(frozenset(range(self.n)), self.read_idle, self.read_own, read_wait)

    def tick(self, ns: float, running: bool = True) -> None:
        threads = self.tuner.threads if running else 0
        runnable = threads + self.neighbours
        each = min(1.0, self.n / runnable) if runnable else 0.0
        seconds = ns / 1e9
        self.wall += seconds
        self.own += threads * each * self.filled * seconds
        self.waited += threads * (1 - each) * seconds
        self.total += self.n * seconds
        self.idle += max(0.0, self.n - runnable) * seconds

    def read_idle(self, cpus: frozenset[int]) -> tuple[int, int]:
        return round(100 * self.idle), round(100 * self.total)

    def read_own(self) -> tuple[float, float]:
        return self.own, self.wall

    def read_wait(self) -> int:
        return round(self.waited * 1e9)

    def run(self, steps: int, times: Callable[[int, int], float], drafted=0) -> list[int]:
        """``run``, the CPUs' times moving with the steps."""
        return run(self.tuner, steps, times, drafted=drafted, draft_cost=0.1, tick=self.tick)


def test_unused_cores_call_the_probe_up_as_soon_as_the_neighbour_leaves() -> None:
    tuner = ThreadTuner(2)
    cpus = Cpus(tuner, 2)
    tuner.cpu = cpus.watch()
    busy = range(1_000, 3_000)

    def times(n: int, step: int) -> float:
        cpus.neighbours = int(step in busy)
        return (BUSY if step in busy else QUIET)[n]

    counts = cpus.run(4_000, times)
    back = counts.index(2, busy.stop)
    # a called probe's first half runs at the count it had: back is its second half
    assert back - busy.stop <= 2 * CPU_CHECK + CALLED_PROBE_STEPS + 1  # not MAX_INTERVAL_BELOW
    assert tuner.count == 2 and counts[-100:].count(2) >= 100 - PROBE_STEPS  # probes down aside
    # while the neighbour held its core, no extra probe: about one per MAX_INTERVAL_BELOW
    ups = sum(1 for i in range(busy.start + 100, busy.stop) if counts[i] == 2 > counts[i - 1])
    assert ups <= (busy.stop - busy.start) // MAX_INTERVAL_BELOW + 1


def test_a_share_of_the_cores_taken_calls_the_probe_down_where_steps_cannot_tell() -> None:
    """Every step drafts a length never seen before, so no step has a
    settled time to be compared with: the CPU times alone see the neighbour."""
    tuner = ThreadTuner(2)
    cpus = Cpus(tuner, 2)
    tuner.cpu = cpus.watch()

    def times(n: int, step: int) -> float:
        cpus.neighbours = int(step >= 3_000)
        return (BUSY if cpus.neighbours else QUIET)[n]

    counts = cpus.run(4_000, times, drafted=lambda step: 1 + step % 500)  # 64 shapes remembered
    moved = counts.index(1, 3_000)
    assert moved - 3_000 <= 2 * CPU_CHECK + CALLED_PROBE_STEPS + 1
    assert tuner.count == 1


def test_a_runner_that_waited_for_work_calls_no_probe() -> None:
    """Between two requests the runner's threads used nothing while the wall
    clock ran: that window says nothing of a neighbour."""
    tuner = ThreadTuner(2)
    cpus = Cpus(tuner, 2)
    tuner.cpu = cpus.watch()
    for _ in range(20):  # twenty requests of 40 steps, a minute apart, on a quiet machine
        cpus.run(40, lambda n, _: QUIET[n])
        cpus.tick(60e9, running=False)
    assert tuner.idle_wait == CPU_CHECK  # no probe the CPU times called lost
    assert tuner.count == 2


@pytest.mark.parametrize(
    ("before", "after", "cpus", "free"),
    [
        ((0, 0), (100, 200), 2, 1.0),  # half of two CPUs' time unused: one core
        ((50, 100), (50, 300), 2, 0.0),
        ((0, 0), (400, 400), 4, 4.0),
        ((5, 10), (5, 10), 2, 0.0),  # no time passed (a coarse clock)
    ],
)
def test_free_cores(before, after, cpus, free) -> None:
    assert free_cores(before, after, cpus) == pytest.approx(free)


def test_idle_cpus_that_are_no_free_core_call_ever_fewer_probes() -> None:
    """Four CPUs, two cores: the idle SMT siblings look unused, but two
    threads are slower while a neighbour holds the other core. The probes
    they call back off as the interval's own do."""
    tuner = ThreadTuner(2, count=1)
    cpus = Cpus(tuner, 4)
    cpus.neighbours = 1
    tuner.cpu = cpus.watch()
    counts = cpus.run(6_000, lambda n, _: BUSY[n])
    assert tuner.count == 1
    ups = sum(1 for i in range(1, len(counts)) if counts[i] == 2 > counts[i - 1])
    assert ups <= 6_000 // MAX_INTERVAL_BELOW + 8  # 16, 32, ... then every 256 at most
    assert tuner.idle_wait == MAX_INTERVAL_BELOW


def test_a_probe_measures_steps_without_drafts(demo_gguf: Path) -> None:
    """The generated model repeats itself, so prompt lookup drafts; while the
    tuner measures, each step is one token, and the probe takes its
    2 x PROBE_STEPS steps exactly (a step with drafts would not count)."""
    params = LoadParams(path=str(demo_gguf), n_ctx=512, n_threads=2, adapt_threads=True)
    engine = Engine(params)
    try:
        tuner = engine.threads
        assert tuner is not None
        tuner.until_probe = 40  # after the drafts are going (or sooner: steps seen slower)
        tuner.cpu = None  # a probe on the schedule (one the CPU times call is longer)
        text: list[str] = []
        done: list[Done] = []
        options = {"temperature": 0, "num_predict": 2000, "draft_num_predict": 4}
        stop: list[bool] = []
        prompt = engine.model.prompt_tokens("hello")
        engine.submit(Job(1, prompt, options, text.append, done.append, print, lambda: bool(stop)))
        measured: list[bool] = []  # before each step: was the tuner measuring?
        while not done and measured[-2:] != [True, False]:  # to the first probe's end
            measured.append(tuner.measuring)
            engine.step()
        assert measured.count(True) == 2 * PROBE_STEPS
        stop.append(True)
        while not done:
            engine.step()
        assert done[0].draft_accepted > 0  # it drafted outside the probe
    finally:
        engine.close()


def test_below_the_default_a_request_after_a_wait_probes_up_at_once() -> None:
    """The neighbour left while the runner waited for work: the next
    request's first CPU check calls the probe up."""
    tuner = ThreadTuner(2)
    cpus = Cpus(tuner, 2)
    tuner.cpu = cpus.watch()
    cpus.neighbours = 1
    cpus.run(300, lambda n, _: BUSY[n])
    assert tuner.count == 1
    cpus.neighbours = 0
    cpus.tick(60e9, running=False)
    counts = cpus.run(100, lambda n, _: QUIET[n])
    assert counts.index(2) <= CPU_CHECK + CALLED_PROBE_STEPS + 1
    assert tuner.count == 2


# Beside a process spinning on one of 2 cores, measured on Gemma: at 2 threads
# most steps take about as long as at 1, and one in eight or so waits out the
# other process's time slice. The mean is what it costs; the median hides it.
def spiky(n: int, step: int) -> float:
    return (25.0 if n == 1 else 170.0 if step % 8 == 7 else 26.0) * MS


def test_steps_that_wait_out_a_time_slice_are_what_the_called_probe_weighs() -> None:
    """The run-queue waits call the probe down, and its halves' means see
    the slow steps that a median of the same steps would not."""
    tuner = ThreadTuner(2)
    cpus = Cpus(tuner, 2)
    tuner.cpu = cpus.watch(waits=True)

    def times(n: int, step: int) -> float:
        cpus.neighbours = int(step >= 3_000)
        return spiky(n, step) if cpus.neighbours else QUIET[n]

    counts = cpus.run(4_000, times, drafted=lambda step: 1 + step % 500)  # no settled shapes
    moved = counts.index(1, 3_000)
    assert moved - 3_000 <= 2 * CPU_CHECK + 2 * CALLED_PROBE_STEPS + 1
    assert tuner.count == 1
    assert counts[:3_000].count(1) / 3_000 < 0.01  # quiet: no call, the schedule's probes only


def test_the_same_steps_judged_by_their_median_keep_every_core() -> None:
    """The control: probes on the schedule alone (medians of 4) stay at 2
    threads beside the neighbour, whose cost is in the slow steps."""
    tuner = ThreadTuner(2)
    counts = run(tuner, 3_000, spiky)
    assert tuner.count == 2 and counts[-500:].count(2) > 490


def runs_of_one(counts: list[int]) -> list[int]:
    """The lengths of the stretches at one thread: a probe's second half each."""
    lengths, run_length = [], 0
    for count in [*counts, 2]:
        if count == 1:
            run_length += 1
        elif run_length:
            lengths, run_length = [*lengths, run_length], 0
    return lengths


@pytest.mark.parametrize("waits", [True, False])
def test_a_runner_that_leaves_its_cores_part_idle_is_not_displaced(waits: bool) -> None:
    """A quiet machine, but the runner's threads use 80 % of their cores'
    time (they sleep between tokens as Python threads hand them on): the
    share reads as displaced, the run-queue waits (nobody waited) do not.
    Where the kernel counts waits, no probe is called."""
    tuner = ThreadTuner(2)
    cpus = Cpus(tuner, 2)
    cpus.filled = 0.8
    tuner.cpu = cpus.watch(waits=waits)
    counts = cpus.run(5_000, lambda n, _: QUIET[n])
    assert tuner.count == 2
    called = [n for n in runs_of_one(counts) if n == CALLED_PROBE_STEPS]
    if waits:
        assert set(runs_of_one(counts)) == {PROBE_STEPS}  # the schedule's probes only
        assert counts.count(1) / len(counts) < 0.01
    else:  # the share alone calls probes (that lose and back off)
        assert called
