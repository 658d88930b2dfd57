"""One of the batch loop's sequences: the tokens whose KV cells it holds,
where images sit among them, and the request it serves now."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jupyter_llm.runner.context_window import Span

if TYPE_CHECKING:
    from jupyter_llm.runner.sequence import Sequence


@dataclass
class Slot:
    """One of the context's sequences: its cached tokens and current job."""

    index: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV entries it holds
    seq: Sequence | None = None
    last_used: float = 0.0
    images: list[Span] = field(default_factory=list)  # positions in ``cached`` that are images
    paused: bool = False  # its sequence is left out of the decode batch (``runner.pausing``)
    paused_order: int = 0  # when it was paused: the earliest resumes first

    def truncate(self, keep: int) -> None:
        """Forget all but the first ``keep`` positions (never inside an image)."""
        del self.cached[keep:]
        self.images = [span for span in self.images if span[1] <= keep]

    def remove(self, start: int, end: int) -> None:
        """Forget the positions ``[start, end)``; those after move down."""
        del self.cached[start:end]
        n = end - start
        self.images = [
            (s, e) if e <= start else (s - n, e - n)
            for s, e in self.images
            if e <= start or s >= end
        ]
