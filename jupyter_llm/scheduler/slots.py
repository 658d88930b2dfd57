"""A loaded model's slots, granted to waiting requests in fair turns across
users (``fair_queue``), interactive before batch (``priority``), and counted
per model, per user and per priority while they run."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from jupyter_llm.request.priority import INTERACTIVE
from jupyter_llm.scheduler.fair_queue import FairQueue, Waiter
from jupyter_llm.scheduler.priority import admits
from jupyter_llm.scheduler.types import Loaded, Request, Unloaded


class SlotGrants:
    """The requests waiting for a slot, and the running ones per user.

    ``max_per_user``: running requests one user may have across all models
    (0: no limit); a user at it waits while others are served."""

    def __init__(self, max_per_user: int) -> None:
        self._max_per_user = max_per_user
        self._fair = FairQueue()
        self._grants: dict[Waiter, tuple[asyncio.Future[None], Loaded]] = {}
        self._active: Counter[str] = Counter()  # running requests per user, all models

    def request(
        self, loaded: Loaded, user: str, priority: str = INTERACTIVE
    ) -> tuple[Waiter, asyncio.Future[None]]:
        """Queue ``user``'s request for a slot on ``loaded``: the future is
        done when it has one (raises ``Unloaded`` if the model goes first)."""
        waiter = self._fair.push(user, loaded.key, priority)
        granted = asyncio.get_running_loop().create_future()
        self._grants[waiter] = (granted, loaded)
        self.dispatch()
        return waiter, granted

    def withdraw(self, waiter: Waiter) -> None:
        """A request left the queue before its slot came."""
        self._fair.remove(waiter)
        self._grants.pop(waiter, None)

    def dispatch(self) -> None:
        """Hand every free slot to the next waiter the fair queue picks."""

        def has_slot(waiter: Waiter) -> bool:
            loaded = self._grants[waiter][1]
            interactive = loaded.by_priority[INTERACTIVE]
            return loaded.runner.alive and admits(
                waiter.priority, interactive, loaded.refcount, loaded.parallel
            )

        limit = self._max_per_user
        while (waiter := self._fair.pop(self._active, limit, has_slot)) is not None:
            granted, loaded = self._grants.pop(waiter)
            loaded.refcount += 1
            loaded.users[waiter.user] += 1
            loaded.by_priority[waiter.priority] += 1
            loaded.admitted[waiter] = time.time()
            self._active[waiter.user] += 1
            granted.set_result(None)

    def give_back(
        self, loaded: Loaded, user: str, priority: str = INTERACTIVE, waiter: Waiter | None = None
    ) -> None:
        """A request on ``loaded`` ended: its slot is free (``dispatch`` hands it
        on). ``waiter``: the request as it was queued (None: any of ``user``'s
        running ones of that priority)."""
        if waiter is None:
            mine = (w for w in loaded.admitted if w.user == user and w.priority == priority)
            waiter = next(mine, None)
        if waiter is not None:
            loaded.admitted.pop(waiter, None)
        loaded.refcount -= 1
        loaded.by_priority[priority] -= 1
        loaded.users[user] -= 1
        if loaded.users[user] <= 0:
            del loaded.users[user]
        self._active[user] -= 1
        if self._active[user] <= 0:
            del self._active[user]

    def fail_queued(self, loaded: Loaded) -> None:
        """``loaded`` is gone: the requests queued on it go back to loading."""
        for waiter, (granted, on) in list(self._grants.items()):
            if on is loaded:
                del self._grants[waiter]
                self._fair.remove(waiter)
                if not granted.done():
                    granted.set_exception(Unloaded(loaded.key))

    def queued(self, model: str) -> dict[str, int]:
        """How many requests each user has waiting for a slot on ``model``."""
        return self._fair.queued(model)

    def queued_by_priority(self, model: str) -> dict[str, dict[str, int]]:
        """Per user, how many requests of each priority wait for ``model``."""
        return self._fair.queued_by_priority(model)

    def requests(self, loaded: Loaded) -> list[Request]:
        """Each request on ``loaded``: the running ones by when they got their
        slot, then the queued ones in arrival order."""
        running = sorted(loaded.admitted.items(), key=lambda item: (item[1], item[0].seq))
        return [
            *(Request("running", w.user, w.priority, t) for w, t in running),
            *(
                Request("queued", w.user, w.priority, w.since)
                for w in self._fair.waiting_for(loaded.key)
            ),
        ]
