"""The conversations behind ``previous_response_id``: in memory, per user, bounded.

The Responses API is stateless unless a client continues a response by its
id. Each stored response keeps its whole conversation (the chat messages it
was given after any instructions, and its own answer), so continuing reads
one entry; and the response object, for ``GET /v1/responses/{id}``.
Entries belong to the user who made them: another user's id is "not
found", as an unknown one is. Bounded by ``STORED_RESPONSES`` per user,
``STORED_BYTES`` in all and ``STORED_SECONDS`` of age; the oldest go first,
and past ``STORED_BYTES`` the oldest of the user holding the most bytes (one
user's 32 MiB conversations no longer push out everyone else's).
Only the event loop touches it, so it needs no lock.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_llm.request.limits import STORED_BYTES, STORED_RESPONSES, STORED_SECONDS


@dataclass(frozen=True)
class Stored:
    user: str
    chat: list[dict[str, Any]]
    size: int
    at: float
    response: dict[str, Any] | None = None


class ResponseStore:
    def __init__(
        self,
        per_user: int = STORED_RESPONSES.value,
        total_bytes: int = STORED_BYTES.value,
        seconds: float = STORED_SECONDS.value,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_user, self.total_bytes, self.seconds = per_user, total_bytes, seconds
        self.clock = clock
        self.entries: OrderedDict[str, Stored] = OrderedDict()  # oldest first
        self.bytes = 0
        self.user_bytes: dict[str, int] = {}
        self.by_user: dict[str, OrderedDict[str, None]] = {}  # each user's ids, oldest first

    def get(self, user: str, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation of ``response_id`` if ``user`` stored it and it has not expired."""
        entry = self.find(user, response_id)
        return None if entry is None else entry.chat

    def find(self, user: str, response_id: str) -> Stored | None:
        """``user``'s entry of ``response_id``: another user's is none."""
        self.expire()
        entry = self.entries.get(response_id)
        return None if entry is None or entry.user != user else entry

    def remove(self, user: str, response_id: str) -> bool:
        """Forget ``user``'s ``response_id``; False if there was none to forget."""
        if self.find(user, response_id) is None:
            return False
        self.drop(response_id)
        return True

    def put(
        self,
        user: str,
        response_id: str,
        chat: list[dict[str, Any]],
        size: int,
        response: dict[str, Any] | None = None,
    ) -> bool:
        """Keep a conversation (and its response object, counted in ``size``),
        dropping the oldest to stay in bounds; one larger than all the store
        may hold is not kept (False)."""
        self.expire()
        if size > self.total_bytes:
            return False
        if response_id in self.entries:
            self.drop(response_id)
        while len(self.by_user.get(user, ())) >= self.per_user:
            self.drop(next(iter(self.by_user[user])))
        while self.bytes + size > self.total_bytes:
            heaviest = max(self.user_bytes, key=self.user_bytes.__getitem__)
            self.drop(next(iter(self.by_user[heaviest])))
        self.entries[response_id] = Stored(user, chat, size, self.clock(), response)
        self.by_user.setdefault(user, OrderedDict())[response_id] = None
        self.bytes += size
        self.user_bytes[user] = self.user_bytes.get(user, 0) + size
        return True

    def drop(self, response_id: str) -> None:
        entry = self.entries.pop(response_id)
        self.bytes -= entry.size
        mine = self.by_user[entry.user]
        del mine[response_id]
        if mine:
            self.user_bytes[entry.user] -= entry.size
        else:
            del self.by_user[entry.user], self.user_bytes[entry.user]

    def expire(self) -> None:
        deadline = self.clock() - self.seconds
        while self.entries and next(iter(self.entries.values())).at < deadline:
            self.drop(next(iter(self.entries)))
