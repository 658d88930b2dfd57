"""Bytes of request bodies the server holds, per user (``bodies_held``).

Each request body is bounded (``body_bytes``), but not how many one user
has in the server at once: bodies queued behind a busy model, or uploads
stopped one byte short, are held until their request ends. A review held
1 GiB with 16 queued 32 MiB prompts, and 511 MiB with 16 stalled uploads.
A request takes its body's bytes from its user's share as they arrive and
gives them back when it ends; past the share it is refused (429) before
more is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jupyter_llm.request.errors import LLMError
from jupyter_llm.request.limits import BODIES_HELD


class TooMuchHeld(LLMError):
    """One user's requests already hold ``bodies_held`` bytes of bodies."""

    status = 429


@dataclass
class HeldBodies:
    """Each user's bytes of bodies held by requests that have not ended."""

    limit: int = BODIES_HELD.value
    held: dict[str, int] = field(default_factory=dict)

    def take(self, user: str, size: int) -> bool:
        """``size`` more bytes for ``user``, unless that goes past the limit."""
        now = self.held.get(user, 0) + size
        if now > self.limit:
            return False
        self.held[user] = now
        return True

    def give(self, user: str, size: int) -> None:
        """``size`` bytes ``user`` took are free again."""
        left = self.held.get(user, 0) - size
        if left > 0:
            self.held[user] = left
        else:
            self.held.pop(user, None)

    def refusal(self, user: str) -> TooMuchHeld:
        return TooMuchHeld(
            f"this user's requests already hold {self.held.get(user, 0):,} bytes of bodies "
            f"in the server; the limit is {self.limit:,} bytes (bodies_held): wait for some "
            "to end (queued prompts are held until they run)"
        )
