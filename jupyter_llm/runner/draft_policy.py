"""When a sequence drafts, and how many tokens: pure rules, table-tested.

A draft costs the target model's work on each drafted token in the batch; it
pays only while enough of them are accepted. Each sequence is judged on its
last ``JUDGE_AFTER`` drafted tokens up to each draft's first rejected one
(the tokens after it say nothing about the lookup, and a long draft's tail
would otherwise stop a sequence that quotes well): below ``MIN_RATE`` accepted, drafting
stops for ``PAUSE_TOKENS`` generated tokens (doubling each time it stops
again, up to ``MAX_PAUSE_TOKENS``), then it is tried again. Free text thus
pays for a few wasted drafts at first and rarely after; text that quotes its
input (code edits, citations) keeps drafting.

The draft's length adapts per sequence: it starts at ``draft_num_predict``,
doubles after a draft accepted whole (up to ``MAX_LENGTH``, the option's own
bound), and halves after a rejected one (down to one token). A long verbatim
quote thus takes up to 17 tokens a step; a quote that wanders costs little more
than a short draft.

What a drafted token costs is measured (``runner.step_costs``: the extra
decode time of one drafted token as a fraction of a step without drafts).
A window must then also win back the time its drafts cost (``owed``), with
a ``MARGIN``: a window that only breaks even still paid for the probes
before it, and measured costs are medians, not bounds. A window that has
already lost ``MAX_LOSS`` steps' time stops at once rather than after
``JUDGE_AFTER`` drafted tokens (on free text, one rejected token per
draft took twelve drafts, 24 steps' time at 4 tokens costing 0.5 each).
Where a draft's size costs ``MAX_COST`` a token or more, it cannot pay even
when accepted whole, so drafting pauses as after a failed window (``paused``).

Prompt lookup's drafts cost nothing to make, only to verify. So a paused
sequence that drafts by lookup keeps drafting in the shadow: each step the
lookup's draft is made but not decoded, and judged against the tokens that
do come (``after_shadow``). Drafting resumes as soon as a shadow window of
``SHADOW_JUDGE`` tokens would have paid, and not before: no blind probes
on free text, and a quote that starts after a pause is drafted from its
second word, not after the pause ran out (on Gemma, simulated over the
benchmarks' greedy answers: a 320-token rewrite 1.59x -> 2.30x fewer steps'
time, a quote 1.47x -> 1.95x, free text 0.98x -> 1.00x). A draft model's
drafts cost its decodes, so there the pause and its probes stay.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_llm.request.limits import DRAFT_TOKENS

JUDGE_AFTER = 12  # drafted tokens between two judgements
MIN_RATE = 0.4  # accepted / drafted below which drafting stops a while
PAUSE_TOKENS = 32  # generated tokens without drafting after the first stop
MAX_PAUSE_TOKENS = 512  # the longest pause, after repeated stops
MAX_LENGTH = DRAFT_TOKENS.value  # the longest draft, as draft_num_predict's own bound
MAX_COST = 0.8  # a drafted token costing this much of a step cannot pay
MARGIN = 1.25  # accepted tokens a passing window needs per token of time it owes
MAX_LOSS = 2.0  # steps' time a window may lose (owed, not yet won back) before it stops
SHADOW_JUDGE = 8  # shadow-drafted tokens between two judgements of a paused sequence


@dataclass(frozen=True)
class Window:
    """One sequence's drafting record since its last judgement."""

    drafted: int = 0
    accepted: int = 0
    resume_at: int = 0  # generated tokens before drafting resumes
    stops: int = 0  # how many times drafting stopped so far
    owed: float = 0.0  # accepted tokens the window's drafts cost (measured), to pay back


@dataclass(frozen=True)
class Shadow:
    """A paused sequence's drafts made but not decoded, since their last judgement."""

    drafted: int = 0
    accepted: int = 0
    owed: float = 0.0


def may_draft(window: Window, generated: int, shadowed: bool = False) -> bool:
    """Does the sequence draft at this point of its output? ``shadowed``
    (prompt lookup): a pause lasts until its shadow resumes it (``resumed``)."""
    if shadowed:
        return window.resume_at == 0
    return generated >= window.resume_at


def resumed(window: Window) -> Window:
    """Drafting again, the stops so far kept."""
    return Window(0, 0, 0, window.stops)


def judged(drafted: int, accepted: int) -> int:
    """A draft's tokens that a judgement counts: up to its first rejected one."""
    return min(drafted, accepted + 1)


def tally(
    record: Window | Shadow, drafted: int, accepted: int, cost: float | None
) -> tuple[int, int, float]:
    """A window's judged tokens (each draft up to its first rejected one),
    accepted tokens and steps' time owed, after one more draft."""
    counted = record.drafted + judged(drafted, accepted)
    return counted, record.accepted + accepted, record.owed + (cost or 0.0) * drafted


def pays(judged: int, accepted: int, owed: float) -> bool:
    """Does a full window pass: ``MIN_RATE`` accepted, and ``MARGIN`` times
    the time its drafts cost won back?"""
    return accepted >= MIN_RATE * judged and accepted >= MARGIN * owed


def after_shadow(
    shadow: Shadow, drafted: int, accepted: int, cost: float | None
) -> tuple[Shadow, bool]:
    """The shadow record after a shadow draft of ``drafted`` tokens of which
    ``accepted`` would have been accepted, at ``cost`` a token; and whether
    drafting resumes: a full window that would have passed ``after_draft``'s
    judgement (counted the same way)."""
    d, a, owed = tally(shadow, drafted, accepted, cost)
    if d < SHADOW_JUDGE:
        return Shadow(d, a, owed), False
    return Shadow(), pays(d, a, owed)


def worth_drafting(cost: float | None) -> bool:
    """May a draft pay at ``cost`` (a drafted token's measured share of a
    step; None: not measured yet, so it is tried)?"""
    return cost is None or cost < MAX_COST


def paused(window: Window, generated: int) -> Window:
    """Drafting stops for ``PAUSE_TOKENS`` generated tokens, doubled each
    time it stopped before (at most ``MAX_PAUSE_TOKENS``)."""
    pause = min(PAUSE_TOKENS << window.stops, MAX_PAUSE_TOKENS)
    return Window(0, 0, generated + pause, window.stops + 1)


def after_draft(
    window: Window, drafted: int, accepted: int, generated: int, cost: float | None = None
) -> Window:
    """The record after a verified draft of ``drafted`` tokens of which
    ``accepted`` matched, with ``generated`` output tokens so far and the
    measured ``cost`` of each of its tokens (None: not measured). A window
    passes with ``MIN_RATE`` accepted and at least the tokens its drafts
    cost (``owed``) times ``MARGIN``: fewer, and the drafts lost time. A
    window that has lost ``MAX_LOSS`` steps' time fails before it is full."""
    d, a, owed = tally(window, drafted, accepted, cost)
    if owed - a >= MAX_LOSS:
        return paused(window, generated)
    if d < JUDGE_AFTER:
        return Window(d, a, window.resume_at, window.stops, owed)
    if pays(d, a, owed):
        return resumed(window)
    return paused(window, generated)


def draft_size(wanted: int, budget: int, room: int) -> int:
    """Tokens to draft: at most ``wanted`` (``draft_num_predict``), never
    past what ``num_predict`` leaves after the token being decoded
    (``budget``: output tokens still allowed, negative for no limit), and
    within ``room`` (cells left in the context and the batch)."""
    size = min(wanted, room)
    if budget >= 0:
        size = min(size, budget - 1)
    return max(0, size)


def next_length(length: int, drafted: int, accepted: int, cut: int = 0) -> int:
    """The sequence's next draft length after a verified draft of ``drafted``
    tokens (at most ``length``) of which ``accepted`` matched: doubled
    (at most ``MAX_LENGTH``) when a full-length draft was accepted whole,
    halved (at least 1) when a token was rejected, else unchanged (a draft
    cut short by the lookup or the limits says nothing about longer ones).
    ``cut``: the length the step's costs cut the draft to, below ``length``
    (``step_costs.cut_draft``; 0: not cut); such a draft, made whole and
    accepted whole, counts as full length."""
    if accepted < drafted:
        return max(1, length // 2)
    if drafted >= length or 0 < cut <= drafted:
        return min(MAX_LENGTH, 2 * length)
    return length
