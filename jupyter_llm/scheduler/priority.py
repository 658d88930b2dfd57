"""Pure policy for interactive and batch requests sharing a model's slots
(``request.priority``); no asyncio here, each decision a table-tested function.

A model decodes ``slots`` sequences at once, and its runner's context holds
``spare_ids(slots)`` more sequence ids than that: an interactive request that
finds every slot busy with batch work still starts, and the runner pauses a
batch sequence for it, whose KV cells stay under its own id
(``runner.pausing``). Batch requests only ever take a slot that is really
free. So a colleague's ``%%llm`` never queues behind a 500-item ``map()``.

Batch work is not starved: when a slot frees while both kinds wait, the
interactive request goes first, but at most ``BATCH_PASSES`` times in a row
for the same model while a batch request could have gone; the next free slot
is then the batch request's. In the runner, a batch sequence is paused at
most ``runner.pausing.MAX_PAUSES`` times and resumes before any waiting
request, so each pause costs it one interactive request's turn at most.
"""

from __future__ import annotations

from jupyter_llm.request.priority import BATCH, INTERACTIVE, spare_ids

BATCH_PASSES = 4  # interactive grants in a row while a batch request could go


def admits(priority: str, interactive: int, running: int, slots: int) -> bool:
    """May a ``priority`` request start on a model with ``running`` requests,
    ``interactive`` of them interactive? Batch: only into a free slot.
    Interactive: while interactive ones hold fewer than all slots and a
    sequence id is left, pausing a batch sequence where no slot is free."""
    if priority == BATCH:
        return running < slots
    return interactive < slots and running < slots + spare_ids(slots)


def batch_due(passed_over: int) -> bool:
    """Has batch work on a model been passed over enough: its turn next?"""
    return passed_over >= BATCH_PASSES


def order(priority: str, due: bool) -> int:
    """Which kind of waiting request goes first (lower first): interactive,
    unless batch work is ``due``."""
    first = BATCH if due else INTERACTIVE
    return 0 if priority == first else 1


def passes_after(passed_over: int, served: str, batch_could_go: bool) -> int:
    """The new count of interactive grants in a row while batch could go:
    reset when a batch request is served, one more when an interactive one
    went while a batch request could have."""
    if served == BATCH:
        return 0
    return passed_over + 1 if batch_could_go else passed_over
