"""What a drafted token costs on this machine, measured from the decode steps.

A drafted token is one more row of the target model's work in the step. On a
GPU that row is nearly free; on a few CPU cores it is not. On 2 cores, Gemma 3
270M (262k vocabulary: its output layer is most of a token's work) takes
about 2x a one-token step's time for a two-token step, so such a draft loses
even when it is accepted whole, and prompt lookup on free text made a single
greedy stream about 20 % slower than without drafts; a tiny model's row costs
a fraction of a step instead. Nor is the cost smooth in the draft's length:
the CPU's matrix kernels take rows in tiles (``benchmarks/verify_rows.py``
there: a drafted token costs 0.90 of a step alone, 0.49 at 3 drafted
tokens, 0.72 at 4, 0.40 at 7; a step of 8 rows takes less time than one of
5). So no fixed rate fits, and the engine measures: every step of generating
sequences alone (no prompt chunk; its decode, the sampling of every
position it verified, 0.4 ms each on Gemma's vocabulary, and a draft model's
own decodes for it) is a sample of the time a step of its number of rows
takes. A drafted token's cost (``cost(k, n)``) is the extra time of a step
of ``n`` sequences and ``k`` drafted tokens over one of ``n`` rows, per
drafted token, as a fraction of one sequence's share of that plain step:
beside other sequences a drafted row delays them all, and priced against
the whole step instead, four sampled streams drafting on 2 cores ran 0.87x
as fast as without drafts. Medians of the last samples, so a step that the
OS preempted moves nothing.

``runner.draft_policy`` turns the cost into decisions (a window of drafts
must win back its cost; a length that cannot pay even when accepted whole
gives way to a longer one that may, or drafting pauses for a growing while),
and ``cut_draft`` cuts a draft to the cheapest length near it.
Runs in the runner process only.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_llm.runner.draft_policy import paused, worth_drafting

if TYPE_CHECKING:
    from jupyter_llm.runner.speculative import Drafting

SAMPLES = 9  # the last steps each median is taken over
MIN_SAMPLES = 3  # draft steps measured before their cost is trusted
CUT_MARGIN = 1.05  # how much more a shorter draft must make per step's time to be cut to


@dataclass
class StepShape:
    """What shares the decode step being filled, as drafting prices it."""

    sequences: int = 1  # generating sequences: one row each before their drafts
    prompting: bool = False  # a prompt chunk shares the step
    drafted: int = 0  # drafted tokens in the batch, once it is filled

    @property
    def alone(self) -> bool:
        """One sequence's rows are the step's (``cut_draft``)."""
        return self.sequences == 1 and not self.prompting


class StepCosts:
    """Decode times of generation-only steps by their number of rows (a
    generating sequence's token and its drafted tokens are one row each):
    ``SAMPLES`` times per row count, at most ``max_tokens`` (the batch), from
    steps of at most ``max_sequences``. One table serves every number of
    sequences: a step's rows cost about the same whether they are drafts of
    one sequence or tokens of several. ``pinned``: a cost to use instead of
    measuring (the tests of drafting's mechanics, which must not depend on
    the machine's speed)."""

    def __init__(self, max_sequences: int, max_tokens: int, pinned: float | None = None) -> None:
        self.max_sequences, self.max_tokens = max(1, max_sequences), max(1, max_tokens)
        self.pinned = pinned
        self._times: dict[int, deque[int]] = {}  # rows in the step -> ns

    def observe(self, sequences: int, tokens: int, elapsed_ns: int) -> None:
        """A decode step of ``sequences`` generating sequences (one token
        each) and ``tokens - sequences`` drafted tokens, no prompt chunk."""
        if not 0 < sequences <= self.max_sequences or not sequences <= tokens <= self.max_tokens:
            return
        if elapsed_ns <= 0 or self.pinned is not None:
            return
        self._times.setdefault(tokens, deque(maxlen=SAMPLES)).append(elapsed_ns)

    def base_ns(self, sequences: int) -> float | None:
        """The median time of a step of ``sequences`` rows: ``sequences``
        tokens without drafts."""
        times = self._times.get(sequences)
        return statistics.median(times) if times else None

    def time_ns(self, rows: int, estimate: bool = False) -> float | None:
        """The median time of a step of ``rows`` rows, where ``MIN_SAMPLES``
        such steps were measured. ``estimate``: where they were not, read
        off the line between the nearest measured counts around it. It
        misses the tiles, but it is not free: the steps of several streams
        drafting at once spread over many row counts, and their drafts were
        judged at no cost until each count had been measured. Past the
        longest step measured, on the line from the shortest count measured
        through the longest: several streams' long drafts add up to steps
        longer than any measured yet (four sampled streams on Gemma, 2
        cores: 36 rows, 411 ms, 8 plain steps' time, were judged free and
        drafted on), and over that span the tiles average out (the line
        through the last two counts can be far off where they fall between
        them). Judging only: a length is still chosen at measured costs
        (``cost``), so it is tried and measured."""
        times = self._times.get(rows)
        if times is not None and len(times) >= MIN_SAMPLES:
            return statistics.median(times)
        if not estimate:
            return None
        known = sorted(r for r, t in self._times.items() if len(t) >= MIN_SAMPLES)
        below, above = [r for r in known if r < rows], [r for r in known if r > rows]
        if not below or (not above and len(below) < 2):
            return None
        lo, hi = (below[-1], above[0]) if above else (below[0], below[-1])
        t_lo, t_hi = self.time_ns(lo), self.time_ns(hi)
        assert t_lo is not None and t_hi is not None
        slope = (t_hi - t_lo) / (hi - lo)
        if not above:  # past the longest: never cheaper than it (a cheap tile measured last)
            return t_hi + max(0.0, slope) * (rows - hi)
        return t_lo + slope * (rows - lo)

    def cost(self, drafted: int, sequences: int = 1, estimate: bool = False) -> float | None:
        """What each of ``drafted`` tokens in a step of ``sequences``
        generating sequences costs, as a fraction of one sequence's share of
        a step without drafts: the step's extra time per drafted token times
        ``sequences`` over the plain step's time. Every sequence in the step
        waits for the extra rows, so for the tokens of all of them to come
        faster, a drafted token must be accepted that often (alone, a
        drafted row costing half a step must be accepted half the time;
        beside three other sequences, whose plain step of 4 rows it
        lengthens by an eighth, also half the time, not an eighth). None
        until ``MIN_SAMPLES`` steps of as many rows were measured, unless
        ``estimate`` (``time_ns``) beside other sequences: what judges
        drafts already made there, where their steps spread over many row
        counts and None would count them free; the choice of a length keeps
        None, so that a length not measured yet is tried and measured.
        Alone, a sequence's drafts make few row counts, each measured within
        its first steps, and judged at the estimate until then the greedy
        rewrite of ``benchmarks/speculative.py`` paused more: 1.63x our rate
        without drafts, against 1.79-1.86x judged only once measured (Gemma,
        2 cores, two in-process A/B runs of 5 rounds)."""
        if self.pinned is not None:
            return self.pinned
        estimate = estimate and sequences > 1
        base = self.base_ns(sequences)
        if base is None and estimate:
            base = self.time_ns(sequences, estimate)
        extra = self.time_ns(sequences + drafted, estimate)
        if base is None or extra is None or drafted <= 0:
            return None
        return max(0.0, sequences * (extra - base) / (drafted * base))


def priced_length(
    costs: StepCosts, state: Drafting, size: int, cap: int, generated: int, sequences: int = 1
) -> int:
    """``size``, the draft a sequence would make now, or where a draft that
    long costs too much a token (``worth_drafting``), the next longer one up
    to ``cap`` (what the limits allow) that may pay: on the CPU a 4-token
    draft can cost less per token than a 2-token one; beside other
    sequences, else the longest shorter one that may (there a long draft's
    rows add up with theirs: 16 tokens beside 3 others cost 0.87 of a
    share a token on Gemma, 2 tokens almost nothing). Where none may, 0, and
    drafting pauses like after a window rejected too often
    (``draft_policy.paused``). The first draft after a pause always goes in,
    so the cost is measured again; a length not measured yet may go in.
    Priced in a step of ``sequences`` generating sequences as if the
    others drafted nothing; once verified, the draft is judged at what all
    the step's drafted tokens cost (``runner.speculative.settle``)."""
    if not size or state.window.drafted == 0:
        return size
    for length in range(size, max(size, cap) + 1):
        if worth_drafting(costs.cost(length, sequences)):
            return length
    if sequences > 1:  # beside others a shorter draft costs less a token (``cut_beside``)
        for length in range(size - 1, 0, -1):
            if worth_drafting(costs.cost(length, sequences)):
                return length
    state.window = paused(state.window, generated)
    return 0


def cut_draft(
    costs: StepCosts, priced: int, length: int, alone: bool, explore: bool = True
) -> tuple[int, int]:
    """The draft's length once cut to the cheapest near it
    (``cheapest_length``), and the cut for ``draft_policy.next_length`` (0:
    none). Only where the sequence's rows are the step's (``alone``: one
    sequence generating, no prompt chunk): in a shared step the tiles fall
    on the whole step's rows, which no one sequence's draft decides. A
    draft the limits had kept below the adaptive ``length`` already is cut
    but not remembered as cut (accepted whole, it does not double the
    length). ``explore``: whether a length not measured yet may be tried
    (not for a shadow draft, which is never decoded so never measured)."""
    if not alone or not priced:
        return priced, 0
    cut = cheapest_length(costs, priced, explore)
    return cut, remembered_cut(cut, priced, length)


def cut_beside(
    costs: StepCosts, priced: int, length: int, sequences: int, drafted: int, rate: float
) -> tuple[int, int]:
    """Beside other sequences (``sequences`` generating, no prompt chunk):
    the draft's length, up to ``priced``, that saves the step the most time,
    and the cut for ``draft_policy.next_length`` (as ``cut_draft``'s). A
    drafted token saves one sequence's share of a plain step where it is
    accepted, which it is with the chance ``rate`` after the token before it
    (the sequence's acceptance so far), and costs what its row adds to the
    step as filled so far (``drafted``: the others' drafted tokens already
    in it), on the times measured or read off the line (``time_ns``'s
    estimate). A drafted row delays every sequence in the step, and on a few
    CPU cores it costs most of a row's time: on Gemma 3 270M, 2 cores
    without AVX-512, four rewrites each drafting 16 tokens made 36-row steps
    of 8 plain steps' time for 4 + 4 x 12 tokens, slower than not drafting,
    where 2 tokens each (6 rows, as fast as 4) are nearly free. 0 where no
    length saves time (the sequence drafts nothing this step); uncut where
    the times are not known yet (the draft goes in, and is measured)."""
    if priced <= 0:
        return priced, 0
    base = costs.base_ns(sequences)
    start = costs.time_ns(sequences + drafted, estimate=True)
    if base is None or start is None:
        return priced, 0
    share = base / sequences  # what an accepted token saves
    best, best_saved, expected, chance = 0, 0.0, 0.0, 1.0
    for k in range(1, priced + 1):
        t = costs.time_ns(sequences + drafted + k, estimate=True)
        if t is None:
            return priced, 0
        chance *= rate
        expected += chance  # tokens accepted, on average, of a draft of k
        saved = expected * share - (t - start)
        if saved > best_saved:
            best, best_saved = k, saved
    return best, remembered_cut(best, priced, length)


def remembered_cut(cut: int, priced: int, length: int) -> int:
    """The cut ``draft_policy.next_length`` remembers for a draft of
    ``priced`` tokens cut to ``cut`` (0: none): only a cut below the
    adaptive ``length`` the draft was made at, not one the limits had kept
    shorter already (accepted whole, that does not double the length)."""
    return cut if cut < priced and priced >= length else 0


def cut_short(
    costs: StepCosts, draft: list[int], asked: int, alone: bool, explore: bool = True
) -> list[int]:
    """A draft the lookup could not fill (fewer tokens than ``asked``: its
    copy reached the end of the text, as in a short loop) cut the same way,
    to the cheapest length near what it has (``cut_draft``'s ``alone`` and
    ``explore``). Not remembered as cut: a lookup that ran short says
    nothing about longer drafts (``draft_policy.next_length``)."""
    if not alone or not 0 < len(draft) < asked:
        return draft
    return draft[: cheapest_length(costs, len(draft), explore)]


def cheapest_length(costs: StepCosts, size: int, explore: bool = True) -> int:
    """The draft length from half of ``size`` up to ``size`` that makes the
    most tokens per step's time were every drafted token accepted,
    ``(1 + k) / (1 + k * cost(k))``, where it beats ``size`` itself by
    ``CUT_MARGIN`` (costs are medians of noisy steps). A step's rows are not
    priced evenly: the CPU's matrix kernels take rows in tiles (measured on
    Gemma, 2 cores, ``benchmarks/verify_rows.py``: a drafted token cost 0.40
    of a step at 7 drafted and 0.72 at 4, a step of 8 rows less than one of
    5), so a draft one token shorter can make more tokens in less time.
    Never longer than ``size``: the adaptive length is what the lookup is
    trusted with. With ``explore``, a length not measured yet is tried
    first (the longest such), so that it gets measured; otherwise it is
    passed over. One that cannot pay (``worth_drafting``) is not chosen."""

    def rate(k: int, cost: float) -> float:
        return (1 + k) / (1 + k * cost)

    asked = costs.cost(size)
    if asked is None:
        return size
    best, best_rate = size, rate(size, asked) * CUT_MARGIN
    for k in range(size - 1, (size + 1) // 2 - 1, -1):
        cost = costs.cost(k)
        if cost is None:
            if explore:
                return k
            continue
        if worth_drafting(cost) and rate(k, cost) > best_rate:
            best, best_rate = k, rate(k, cost)
    return best
