"""Which sequences the batch loop decodes: interactive work first, batch work
paused for it and resumed afterwards, losing nothing (``request.priority``).

How a paused sequence keeps its cells: the context holds more sequence ids
than decode slots (``request.priority.spare_ids``: one spare id per slot).
A paused sequence stays in its slot under its own id, its KV cells and its
sampler untouched; it is only left out of the decode batch. The interactive
request takes an idle id beside it, so it starts in the same step, and the
paused sequence later decodes its next token at the position it stopped at,
from the same cells, with the same sampler: its greedy output is the output
of an unpaused run. Moving the cells elsewhere (to the host, or dropping and
re-evaluating them) would cost time at every pause and could change the
numbers; spare ids cost nothing but a few cells of a windowed (SWA) cache,
which the memory estimate counts. Paused cells count as used: a batch
sequence keeps its cells where the interactive prompt fits beside the cells
sequences hold (idle caches are dropped for it as ever).

Where it does not (batch work fills the context), the pause drops the
cells of a batch sequence whose cells make the room (``runner.refill``):
its tokens and all its state stay in Python, and on resume its tokens are
decoded again, a chunk a step, before it decodes on from where it stopped.
A sequence with images is never dropped (its image cells cannot be decoded
again from tokens), nor one whose cells would not make the room: the
interactive request then waits for a free slot. Spare ids always suffice:
a pause pairs a paused sequence with a running interactive one, and a
free slot resumes a paused one first, so the paused never outnumber the
slots, and with every id held, every running sequence is interactive.

While an interactive prompt is read, the batch sequences still running sit
the step out (``sits_out``): the prompt's step is as short as on an idle
model, since the step's cost grows with the logits of every sequence in it.

Batch work is not starved (pure rules below, table-tested): a paused
sequence resumes before any waiting request takes a free slot; a sequence
is paused at most ``MAX_PAUSES`` times, and once resumed it is paused again
only after it decoded something, so every pause costs it one interactive
request's turn at most and it always gets on; batch sequences sit out at
most ``MAX_SIT_OUT`` steps in a row.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_llm.request.priority import BATCH, rank
from jupyter_llm.runner.refill import drop_cells, refill_chunk

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.sequence import Sequence
    from jupyter_llm.runner.slot import Slot

MAX_PAUSES = 8  # times one batch sequence may be paused
MAX_SIT_OUT = 4  # decode steps in a row batch sequences may sit out for interactive prompts


@dataclass(frozen=True)
class Held:
    """What the rules need to know of one sequence id that holds a sequence."""

    index: int
    batch: bool
    paused: bool
    pauses: int  # times it was paused so far
    progressed: bool  # decoded something since it started or last resumed
    paused_order: int = 0  # when it was paused (lower: earlier)
    cells: int = 0  # KV cells it holds
    droppable: bool = True  # its cells may be dropped and decoded again (no images)


@dataclass(frozen=True)
class Move:
    """One thing to do: start ``start`` (a position in the waiting queue),
    after pausing ``pause`` (a slot) where set, its cells dropped where
    ``drop``; or resume ``resume`` (a slot)."""

    start: int | None = None
    pause: int | None = None
    resume: int | None = None
    drop: bool = False


def pausable(held: Held) -> bool:
    """May this running sequence be paused for an interactive request?"""
    return (
        held.batch
        and not held.paused
        and held.pauses < MAX_PAUSES
        and (held.pauses == 0 or held.progressed)
    )


def next_move(
    held: Seq[Held], idle_ids: int, waiting: Seq[str], slots: int, short: int = 0
) -> Move | None:
    """The next move, or None when nothing changes now.

    ``held``: the ids holding a sequence; ``idle_ids``: ids holding none;
    ``waiting``: the waiting jobs' priorities in arrival order; ``slots``:
    sequences decoded at once; ``short``: the cells the first interactive
    job's prompt lacks beside the cells sequences hold (0: it fits). A free
    slot goes to the earliest paused sequence, else to the first interactive
    job, else to the first job. With no free slot, an interactive job pauses
    a pausable batch sequence (the least paused, then the highest id) if an
    id is idle for it: keeping its cells where the prompt fits beside them,
    else dropping the cells of one whose cells make the room (the least
    paused, then the fewest cells to decode again); else it waits."""
    running = [h for h in held if not h.paused]
    first = min(range(len(waiting)), key=lambda i: (rank(waiting[i]), i), default=None)
    if len(running) < slots:
        paused = [h for h in held if h.paused]
        if paused:
            return Move(resume=min(paused, key=lambda h: h.paused_order).index)
        if first is not None and idle_ids:
            return Move(start=first)
        return None
    if first is None or waiting[first] == BATCH or not idle_ids:
        return None
    victims = [h for h in running if pausable(h)]
    if victims and short <= 0:
        victim = min(victims, key=lambda h: (h.pauses, -h.index))
        return Move(start=first, pause=victim.index)
    victims = [h for h in victims if h.droppable and h.cells >= short]
    if not victims:
        return None
    victim = min(victims, key=lambda h: (h.pauses, h.cells, -h.index))
    return Move(start=first, pause=victim.index, drop=True)


def sits_out(interactive_prompting: bool, sat_out: int) -> bool:
    """Do the running batch sequences sit this step out? While an interactive
    prompt is read, its step holds it alone (with other interactive work), so
    its first token costs what it costs on an idle model rather than a step
    with every batch sequence's logits; at most ``MAX_SIT_OUT`` steps in a row,
    so batch work still moves under a stream of interactive prompts."""
    return interactive_prompting and sat_out < MAX_SIT_OUT


def prompt_order(seq: Sequence) -> tuple[int, int]:
    """Prompt chunks go into a step interactive first, then by arrival, so a
    batch prompt never delays an interactive request's first token."""
    return rank(seq.job.priority), seq.started_ns


class Pauses:
    """The pause state of the sequences in slots, and the moves of ``next_move``."""

    def __init__(self, memory: Any = None) -> None:
        self._memory = memory  # the context's KV cache (``refill.drop_cells``)
        self._pauses: dict[int, int] = {}  # id(sequence) -> times paused
        self._mark: dict[int, tuple[int, int]] = {}  # id(sequence) -> progress at (re)start
        # id(sequence) -> the tokens of its dropped cells (None: to drop before the next step)
        self._kept: dict[int, list[int] | None] = {}
        self._refilling: set[int] = set()  # resumed, its cells not all back yet
        self._order = 0
        self._sat_out = 0  # steps in a row batch sequences sat out (``sits_out``)

    def held(self, slots: Iterable[Slot]) -> list[Held]:
        """The slots holding a sequence, as ``next_move`` reads them (and the
        records of sequences no longer in a slot forgotten)."""
        out = []
        for slot in slots:
            seq = slot.seq
            if seq is None:
                continue
            key = id(seq)
            mark = self._mark.setdefault(key, _progress(seq))
            out.append(
                Held(
                    index=slot.index,
                    batch=seq.job.priority == BATCH,
                    paused=slot.paused and key not in self._refilling,
                    pauses=self._pauses.get(key, 0),
                    progressed=_progress(seq) != mark,
                    paused_order=slot.paused_order,
                    cells=self._cells(slot),
                    droppable=not slot.images and not seq.job.images,
                )
            )
        live = {id(slot.seq) for slot in slots if slot.seq is not None}
        for book in (self._pauses, self._mark, self._kept):
            for key in [k for k in book if k not in live]:
                del book[key]
        self._refilling &= live
        return out

    def next_move(
        self, slots: Seq[Slot], waiting: Seq[Sequence], n_slots: int, n_ctx: int
    ) -> Move | None:
        idle = sum(1 for s in slots if s.seq is None)
        held = sum(self._cells(s) for s in slots if s.seq is not None)  # idle caches may go
        first = next((q for q in waiting if q.job.priority != BATCH), None)
        short = 0 if first is None else held + len(first.job.tokens) + 1 - n_ctx
        priorities = [q.job.priority for q in waiting]
        return next_move(self.held(slots), idle, priorities, n_slots, short)

    def this_step(self, running: list[Sequence]) -> list[Sequence]:
        """The running sequences that go into this decode step (``sits_out``)."""
        prompting = any(q.job.priority != BATCH and not q.prompt_done for q in running)
        batch = any(q.job.priority == BATCH for q in running)
        if batch and sits_out(prompting, self._sat_out):
            self._sat_out += 1
            return [q for q in running if q.job.priority != BATCH]
        self._sat_out = 0
        return running

    def turn(self, slots: Seq[Slot], move: Move) -> None:
        """Apply ``move``'s pause or resume."""
        if move.pause is not None:
            self.pause(slots[move.pause], move.drop)
        if move.resume is not None:
            self.resume(slots[move.resume])

    def pause(self, slot: Slot, drop: bool = False) -> None:
        """Leave ``slot``'s sequence out of the decode batch; its cells stay,
        unless ``drop`` (their tokens are kept to decode them again)."""
        assert slot.seq is not None
        key = id(slot.seq)
        self._pauses[key] = self._pauses.get(key, 0) + 1
        self._order += 1
        slot.paused, slot.paused_order = True, self._order
        if drop:  # before the next step: this one may still be sampling it (drafts)
            self._kept[key] = None

    def resume(self, slot: Slot) -> None:
        """``slot``'s sequence decodes again, from where it stopped; where
        its cells were dropped, once ``refill`` decoded them again."""
        assert slot.seq is not None
        key = id(slot.seq)
        self._mark[key] = _progress(slot.seq)
        if self._kept.get(key, ()) is None:
            del self._kept[key]  # its cells were not dropped yet: they stay
        if key in self._kept:
            self._refilling.add(key)  # it holds its slot, still out of the batch
        else:
            slot.paused = False

    def _cells(self, slot: Slot) -> int:
        """The KV cells ``slot`` holds, those about to be dropped left out."""
        pending = slot.seq is not None and self._kept.get(id(slot.seq), ()) is None
        return 0 if pending else len(slot.cached)

    def before_step(self, engine: Engine) -> None:
        """Drop the cells of sequences paused to drop them; then the next
        chunk of the earliest resumed sequence whose cells were dropped
        (``refill.refill_chunk``), unless the batch sequences sit out an
        interactive prompt's steps (``sits_out``)."""
        for slot in engine.slots:
            if slot.seq is not None and self._kept.get(id(slot.seq), ()) is None:
                self._kept[id(slot.seq)] = drop_cells(self._memory, slot)
        waiting = [s for s in engine.slots if s.seq is not None and id(s.seq) in self._refilling]
        if not waiting:
            return
        running = [s.seq for s in engine.slots if s.seq is not None and not s.paused]
        prompting = any(q.job.priority != BATCH and not q.prompt_done for q in running)
        if sits_out(prompting, self._sat_out):
            return
        slot = min(waiting, key=lambda s: s.paused_order)
        assert slot.seq is not None
        key = id(slot.seq)
        kept = self._kept[key]
        assert kept is not None
        if refill_chunk(engine, slot, kept, len(running)):
            slot.paused = False
            del self._kept[key]
            self._refilling.discard(key)

    def started(self, slot: Slot) -> None:
        """A waiting job took ``slot``: it runs (never paused yet)."""
        slot.paused = False
        if slot.seq is not None:
            self._pauses.pop(id(slot.seq), None)
            self._mark[id(slot.seq)] = _progress(slot.seq)


def _progress(seq: Any) -> tuple[int, int]:
    """How far a sequence got: prompt tokens fed, tokens generated."""
    return seq.fed, len(seq.generated)
