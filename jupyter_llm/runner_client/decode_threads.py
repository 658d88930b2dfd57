"""The CPU threads a runner decodes with, as the server knows them: the count
it loaded with, and the count its last request ended with (a runner at the
default count moves between 1 and that while other work holds its cores:
``runner.thread_tuning``). ``/api/ps`` shows both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_THREADS = 1024  # num_thread's own bound: a larger count is not believed


@dataclass
class DecodeThreads:
    loaded: int = 0  # the load's count (0: not told)
    adaptive: bool = False  # the runner tunes it (the default count, every layer on the CPU)
    now: int = 0  # as the last request ended; the load's count before any

    @classmethod
    def from_load(cls, info: dict[str, Any]) -> DecodeThreads:
        """From the runner's load reply (``n_threads``, ``adaptive_threads``)."""
        count = info.get("n_threads")
        count = count if is_count(count) else 0
        return cls(count, info.get("adaptive_threads") is True, count)

    def saw(self, batch: list[dict[str, Any]]) -> None:
        """A batch of the runner's ``complete`` replies: a ``done`` says the count
        it ended with. A count outside 1..loaded is not believed (nor any
        where the load told none)."""
        for message in batch:
            threads = message.get("threads") if message.get("type") == "done" else None
            if is_count(threads) and threads <= self.loaded:
                self.now = threads

    def describe(self) -> dict[str, Any]:
        """``/api/ps``'s ``threads``: ``{"now", "loaded", "adaptive"}``."""
        return {"now": self.now, "loaded": self.loaded, "adaptive": self.adaptive}


def is_count(value: Any) -> bool:
    """A thread count: an int (not a bool) in 1..``MAX_THREADS``."""
    return type(value) is int and 1 <= value <= MAX_THREADS
