"""How many threads a runner decodes with, fitted to what the machine leaves it.

The default is one thread per physical core the runner may use
(``cpu_threads``): the fastest count on a quiet machine. But a notebook's
kernel often computes beside the model (pandas, a training loop), and
llama.cpp's threads meet at a barrier after every operation: a step takes as
long as its slowest thread, and the thread whose core the kernel holds is
slow. Measured on 2 cores, Gemma 3 270M: 66 tokens/s on 2 threads and 41 on
1 when the machine is quiet; beside one busy process, 24 on 2 threads and 42
on 1. So where the count is the default (no ``num_thread``, no
``JUPYTER_LLM_NUM_THREADS``: those are kept as set), the engine times its
decode steps and now and then runs a few at one thread fewer, or one more
(up to the default); it keeps whichever count's steps are faster.

The rules, on the steps of generating sequences alone:

- a probe measures ``PROBE_STEPS`` steps at the current count, then as many
  at a neighbouring count, both without drafts (the engine drafts nothing
  while the tuner is ``measuring``), so both sides do the same work a step
  and the machine has no time to change between them;
- the neighbouring count wins when its median step is ``MARGIN`` faster, and
  the count moves there;
- a probe runs after ``FIRST_PROBE`` steps, then after twice as many each
  time it loses (up to ``MAX_INTERVAL``): on a quiet machine probes soon
  cost almost nothing. Below the default count the wait stays under
  ``MAX_INTERVAL_BELOW``;
- when the current count's last ``SAMPLES`` steps took, at the median,
  ``SLOWER`` than when it was settled (a neighbour started; each step against
  the settled median of its shape: as many sequences and drafted tokens),
  the next probe is due at once;
- the CPUs say more than the steps (``CpuWatch``, every ``CPU_CHECK``
  steps). At the default count, a runner whose threads waited for a CPU
  ``WAIT`` of a core's time or more (``cpu_threads.run_queue_wait``; where
  the kernel does not count that, whose threads got less than ``SHARE`` of
  their cores' time, ``cpu_threads.own_cpu_seconds``) was displaced by other
  work: the probe down is due at once (the steps alone show it late where
  drafts make steps of many shapes). Below the default, a
  neighbour that leaves does not show in the steps at all; where a core's
  worth (``FREE_CORE``) of the runner's CPUs went unused
  (``cpu_threads.idle_jiffies``), or the runner waited for work through
  most of the window (the next request's first steps), the probe up is due
  at once. CPU time is
  not always speed (an idle SMT sibling is no free core; a CPU quota):
  each probe they call that loses doubles the steps before the next (up to
  ``MAX_INTERVAL_BELOW``);
- a probe the CPU times call takes ``CALLED_PROBE_STEPS`` steps a half and
  compares the halves' mean step times, not their medians. Where other work
  shares the cores, most steps at the default count take about as long as at
  one thread fewer, and one in eight or so waits out a whole time slice of
  the other work (24-30 ms against 130-200 ms, measured on Gemma beside a
  spinning process): those steps are the cost, and a median of four missed
  them. On a quiet machine a median is the better judge (a rare preempted
  step is noise there), so probes on the schedule keep it.

Pure rules over plain numbers: the engine feeds times and sets the count it
is told (``llama_set_n_threads``). Runs in the runner process only.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

PROBE_STEPS = 4  # steps timed at each of the two counts of a probe
FIRST_PROBE = 128  # steps at a count before its first probe
MAX_INTERVAL = 2048  # the longest wait between probes, after probes that lost
MAX_INTERVAL_BELOW = 256  # the same below the default: a neighbour that left shows only so
MARGIN = 0.08  # a probe must be this much faster to win
SLOWER = 1.3  # steps this much slower than when settled: probe now
SAMPLES = 9  # recent steps each median is taken over
MIN_SAMPLES = 3  # a shape's steps at the current count before it is compared
CPU_CHECK = 16  # steps between two reads of the CPU times
FREE_CORE = 0.6  # of a core unused meanwhile, below the default: the probe up is due
WAIT = 0.25  # of a core the runner's threads waited for a CPU, at the default: probe down
SHARE = 0.85  # where the kernel counts no waits: of its threads' cores' time the runner got
CALLED_PROBE_STEPS = 12  # steps timed at each count of a probe the CPU times called
MAX_SHAPES = 64  # shapes remembered (many streams drafting make many); the oldest go first

Shape = tuple[int, int]  # (sequences, tokens) of a step
Jiffies = tuple[int, int]  # (idle, all) of some CPUs since boot
Seconds = tuple[float, float]  # (this process's CPU time, wall time)


@dataclass
class CpuWatch:
    """What the CPU times say, every ``CPU_CHECK`` steps outside probes: at
    the default count, how long this process's threads waited for a CPU
    (``read_wait``: ``cpu_threads.run_queue_wait``), or where that is not
    counted the share of its threads' cores it got (``read_own``:
    ``cpu_threads.own_cpu_seconds``, whose clock times every window); below
    it, the unused time of the runner's ``cpus`` (``read_idle``:
    ``cpu_threads.idle_jiffies``). Tests pass readers of their own."""

    cpus: frozenset[int]
    read_idle: Callable[[frozenset[int]], Jiffies | None]
    read_own: Callable[[], Seconds]
    read_wait: Callable[[], int | None] = lambda: None
    steps: int = 0
    busy_ns: int = 0  # the window's steps' own time: a window spent mostly idle says nothing
    last_idle: Jiffies | None = None
    last_own: Seconds | None = None
    last_wait: int | None = None

    def step(self, tuner: ThreadTuner, elapsed_ns: int) -> None:
        if tuner.measuring:
            self.last_idle = self.last_own = self.last_wait = None  # windows start again after it
            return
        self.steps += 1
        self.busy_ns += max(0, elapsed_ns)
        if self.last_own is not None and self.steps < CPU_CHECK:
            return
        below = tuner.count < tuner.maximum
        own, idle = self.read_own(), self.read_idle(self.cpus) if below else None
        wait = None if below else self.read_wait()
        last_own, last_idle, last_wait = self.last_own, self.last_idle, self.last_wait
        busy = self.busy_ns
        self.last_own, self.last_idle, self.last_wait = own, idle, wait
        self.steps = self.busy_ns = 0
        if last_own is None or own[1] <= last_own[1]:
            return  # no window yet
        wall = own[1] - last_own[1]
        if wall * 1e9 > 2 * busy:  # the runner waited for work through most of it
            if below:  # a neighbour may have left meanwhile: it is cheap to look
                tuner.saw_free_cores(FREE_CORE)
            return
        if below and idle is not None and last_idle is not None:
            tuner.saw_free_cores(free_cores(last_idle, idle, len(self.cpus)))
        elif not below:
            if wait is not None:  # no verdict on a window that has no start or lost a thread
                known = last_wait is not None and wait >= last_wait
                displaced = known and (wait - last_wait) / 1e9 / wall >= WAIT
            else:  # the kernel counts no waits
                displaced = (own[0] - last_own[0]) / wall / tuner.count < SHARE
            if displaced:
                tuner.saw_displaced()


@dataclass
class ThreadTuner:
    """One engine's thread count: ``count`` now, between 1 and ``maximum``."""

    maximum: int
    count: int = 0  # 0: ``maximum``
    interval: int = FIRST_PROBE  # steps between probes
    until_probe: int = FIRST_PROBE
    probing: int = 0  # the count probed (0: none)
    phase: int = 0  # 0: no probe; 1: timing the count; 2: timing the probed count
    probe_steps: int = 0  # steps run in this phase
    timed: dict[int, dict[Shape, list[int]]] = field(default_factory=dict)  # phase -> steps
    settled: dict[Shape, float] = field(default_factory=dict)  # the count's medians when settled
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))  # / settled
    times: dict[Shape, deque[int]] = field(default_factory=dict)  # the count's recent steps, ns
    up_next: bool = False  # alternate the probe's direction where both are open
    cpu: CpuWatch | None = None  # the CPU times call probes (see the module's rules)
    idle_wait: int = CPU_CHECK  # steps after a probe before the CPU times call another
    since_probe: int = 0  # steps since the last probe ended
    called: bool = False  # this probe was called by the CPU times

    def __post_init__(self) -> None:
        self.maximum = max(1, self.maximum)
        self.count = self.count or self.maximum

    @property
    def threads(self) -> int:
        """The count the next step runs at."""
        return self.probing if self.phase == 2 else self.count

    @property
    def measuring(self) -> bool:
        """A probe times its steps: the engine drafts nothing meanwhile."""
        return self.phase != 0

    def observe(self, sequences: int, tokens: int, elapsed_ns: int) -> int:
        """One decode step of ``sequences`` generating sequences and
        ``tokens`` tokens in all (drafts included), no prompt chunk, at
        ``threads``; returns the count for the next step."""
        if self.maximum == 1:
            return 1
        shape = (sequences, tokens)
        if self.phase:
            self._probe_step(shape, elapsed_ns)
            return self.threads
        if elapsed_ns > 0:
            if shape not in self.times and len(self.times) >= MAX_SHAPES:
                oldest = next(iter(self.times))
                del self.times[oldest]
                self.settled.pop(oldest, None)
            self.times.setdefault(shape, deque(maxlen=SAMPLES)).append(elapsed_ns)
        self.until_probe -= 1
        self.since_probe += 1
        if self.cpu is not None:
            self.cpu.step(self, elapsed_ns)
        if self._slowed(shape, elapsed_ns) or self.until_probe <= 0:
            self._start_probe()
        return self.threads

    def saw_free_cores(self, free: float) -> None:
        """``free`` cores' worth of this runner's CPUs went unused since the
        last check (``free_cores``): below the default, probe up now."""
        if self.count < self.maximum and free >= FREE_CORE:
            self._call_probe(up=True)

    def saw_displaced(self) -> None:
        """Other work kept this runner's threads off their cores since the
        last check (``CpuWatch``): at the default count, probe down now."""
        if self.count == self.maximum:
            self._call_probe(up=False)

    def _call_probe(self, up: bool) -> None:
        """The CPU times call the next probe now (``up`` or down), unless one
        runs or the last ended fewer than ``idle_wait`` steps ago."""
        if self.since_probe >= self.idle_wait and not self.phase:
            self.up_next, self.until_probe, self.called = up, 0, True

    def _median(self, shape: Shape) -> float | None:
        times = self.times.get(shape)
        return statistics.median(times) if times and len(times) >= MIN_SAMPLES else None

    def _slowed(self, shape: Shape, elapsed_ns: int) -> bool:
        """The step just observed, against its shape's settled median: are
        the recent ones, at the median, ``SLOWER``?"""
        then = self.settled.get(shape)
        if then is None:
            if (now := self._median(shape)) is not None:
                self.settled[shape] = now  # its first median, as it settles
            return False
        if elapsed_ns > 0:
            self.recent.append(elapsed_ns / then)
        return len(self.recent) > SAMPLES // 2 and statistics.median(self.recent) > SLOWER

    def _start_probe(self) -> None:
        down, up = self.count - 1, self.count + 1
        if up <= self.maximum and (self.up_next or down < 1):
            self.probing = up
        else:
            self.probing = down if down >= 1 else up
        self.up_next = not self.up_next
        self.phase, self.probe_steps, self.timed = 1, 0, {1: {}, 2: {}}

    def _probe_step(self, shape: Shape, elapsed_ns: int) -> None:
        self.probe_steps += 1
        if elapsed_ns > 0 and shape[0] == shape[1]:  # no draft (one made before the probe)
            self.timed[self.phase].setdefault(shape, []).append(elapsed_ns)
        steps = max((len(v) for v in self.timed[self.phase].values()), default=0)
        length = CALLED_PROBE_STEPS if self.called else PROBE_STEPS
        if steps < length and self.probe_steps < 4 * length:  # 4x: the steps that drafted
            return
        if self.phase == 1:
            self.phase, self.probe_steps = 2, 0
            return
        self._end_probe(self._verdict())

    def _verdict(self) -> bool | None:
        """Did the probed count win? None: no shape was timed at both counts."""
        base, probe = self.timed[1], self.timed[2]
        shared = [shape for shape in probe if shape in base]
        if not shared:
            return None
        shape = max(shared, key=lambda s: min(len(base[s]), len(probe[s])))
        typical = statistics.fmean if self.called else statistics.median
        return typical(probe[shape]) < (1 - MARGIN) * typical(base[shape])

    def _end_probe(self, won: bool | None) -> None:
        """``won`` None (the sequences changed between the halves): no
        verdict, the same wait again."""
        if self.called and won is not None:  # CPU times that were no speed: wait longer
            self.idle_wait = CPU_CHECK if won else min(MAX_INTERVAL_BELOW, 2 * self.idle_wait)
        self.called, self.since_probe = False, 0
        self.recent.clear()
        if won:  # the count's times are gone with it: the new count's come as it runs
            self.count = self.probing
            self.interval = FIRST_PROBE
            self.times, self.settled = {}, {}
        elif won is not None:
            longest = MAX_INTERVAL if self.count == self.maximum else MAX_INTERVAL_BELOW
            self.interval = min(longest, 2 * self.interval)
            self.settled = {shape: m for shape in self.times if (m := self._median(shape))}
        self.probing, self.phase = 0, 0
        self.until_probe = self.interval


def free_cores(before: Jiffies, after: Jiffies, cpus: int) -> float:
    """The cores' worth of ``cpus`` CPUs that went unused between two reads
    of their (idle, all) jiffies."""
    idle, total = after[0] - before[0], after[1] - before[1]
    return cpus * idle / total if total > 0 else 0.0
