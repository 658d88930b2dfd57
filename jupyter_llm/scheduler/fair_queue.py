"""Pure policy for sharing a model's slots between users (no asyncio here).

Each user has a FIFO queue of pending requests. When a slot frees, the next
request comes from the user served least recently (never served: first),
so one user's batch of 500 prompts does not starve another user's chat.
A user at the per-user limit of concurrent requests is passed over (their
requests stay queued), and so is a request whose model has no free slot.
Priority comes before fairness: interactive requests go before batch ones,
unless batch work on that model is due (``scheduler.priority``). The queue
itself is shared too (``may_wait``): one user cannot fill it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from jupyter_llm.request.priority import INTERACTIVE
from jupyter_llm.scheduler.priority import batch_due, order, passes_after


def may_wait(waiting: int, mine: int, max_queue: int) -> bool:
    """May a user holding ``mine`` of the ``waiting`` requests queue one more?
    Never past ``max_queue``; its last quarter is kept for users holding less
    than a quarter of it, so one user's flood (512 requests sent at once)
    leaves the others room rather than a 503."""
    if waiting >= max_queue:
        return False
    share = max(1, max_queue // 4)
    return waiting < max_queue - share or mine < share


@dataclass(frozen=True, eq=False)
class Waiter:
    """One pending request: whose, for which model, its arrival order and
    priority, and when it was queued (wall clock, for ``/api/ps``)."""

    user: str
    model: str
    seq: int
    priority: str = INTERACTIVE
    since: float = 0.0


def next_waiter(
    waiting: Iterable[Waiter],
    last_served: Mapping[str, int],
    active: Mapping[str, int],
    limit: int,
    has_slot: Callable[[Waiter], bool],
    passed_over: Mapping[str, int] | None = None,
) -> Waiter | None:
    """The waiter to serve next, or None when none can go now.

    ``last_served``: the tick each user was last served at (absent: never);
    ``active``: each user's running requests; ``limit`` 0: no per-user limit;
    ``passed_over``: per model, interactive grants in a row while batch work
    could go. Each user's earliest servable request of each priority
    competes; interactive goes first (batch where it is due), then the least
    recently served user, ties broken by arrival."""
    passed = passed_over or {}
    first: dict[tuple[str, str], Waiter] = {}
    for w in waiting:
        if (w.user, w.priority) in first or not has_slot(w):
            continue
        if limit and active.get(w.user, 0) >= limit:
            continue
        first[w.user, w.priority] = w
    if not first:
        return None
    return min(
        first.values(),
        key=lambda w: (
            order(w.priority, batch_due(passed.get(w.model, 0))),
            last_served.get(w.user, -1),
            w.seq,
        ),
    )


@dataclass
class FairQueue:
    """The pending requests and each user's last service, for ``next_waiter``."""

    _waiting: list[Waiter] = field(default_factory=list)  # in arrival order
    _last_served: dict[str, int] = field(default_factory=dict)
    _ticks: itertools.count = field(default_factory=itertools.count)
    _seqs: itertools.count = field(default_factory=itertools.count)
    _passed_over: dict[str, int] = field(default_factory=dict)  # per model (``order``)

    def push(self, user: str, model: str, priority: str = INTERACTIVE) -> Waiter:
        waiter = Waiter(user, model, next(self._seqs), priority, time.time())
        self._waiting.append(waiter)
        return waiter

    def remove(self, waiter: Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)

    def pop(
        self, active: Mapping[str, int], limit: int, has_slot: Callable[[Waiter], bool]
    ) -> Waiter | None:
        """The next waiter to serve (taken out of the queue), or None."""
        waiter = next_waiter(
            self._waiting, self._last_served, active, limit, has_slot, self._passed_over
        )
        if waiter is not None:
            self._waiting.remove(waiter)
            self._last_served[waiter.user] = next(self._ticks)
            batch_could_go = any(
                w.model == waiter.model and w.priority != INTERACTIVE and has_slot(w)
                for w in self._waiting
            )
            passes = self._passed_over.get(waiter.model, 0)
            self._passed_over[waiter.model] = passes_after(passes, waiter.priority, batch_could_go)
        return waiter

    def queued(self, model: str) -> dict[str, int]:
        """How many requests each user has waiting for ``model``."""
        counts: dict[str, int] = {}
        for w in self._waiting:
            if w.model == model:
                counts[w.user] = counts.get(w.user, 0) + 1
        return counts

    def queued_by_priority(self, model: str) -> dict[str, dict[str, int]]:
        """Per user, how many requests of each priority wait for ``model``."""
        counts: dict[str, dict[str, int]] = {}
        for w in self._waiting:
            if w.model == model:
                mine = counts.setdefault(w.user, {})
                mine[w.priority] = mine.get(w.priority, 0) + 1
        return counts

    def waiting_for(self, model: str) -> list[Waiter]:
        """The requests waiting for ``model``, in arrival order."""
        return [w for w in self._waiting if w.model == model]

    def __len__(self) -> int:
        return len(self._waiting)


def unload_now(holders: Mapping[str, int], requester: str, admin: bool) -> bool:
    """An unload asked by ``requester`` goes ahead now when nobody holds the
    model, or when an admin asks and other users hold it (their requests end
    with an error). Otherwise it waits until the model is idle."""
    if not any(holders.values()):
        return True
    return admin and any(n and user != requester for user, n in holders.items())
