"""Stop strings found in streamed text in time linear in the text.

Every stop is checked after every token in the loop all sequences share, so
the check must not grow with the square of a stop's length (a naive check of
a 16 KiB stop costs hundreds of millions of character comparisons per token). Each
stop keeps a Knuth-Morris-Pratt state: how much of it the text ends with.
Text that may still become a stop is held back; the rest may be emitted.
"""

from __future__ import annotations


def _failure(stop: str) -> list[int]:
    """KMP's table: for each prefix of ``stop``, the longest proper prefix
    that is also its suffix."""
    table = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = table[k - 1]
        if stop[i] == stop[k]:
            k += 1
        table[i] = k
    return table


class StopScanner:
    """One sequence's stop strings over its streamed text."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._failure = [_failure(s) for s in self.stops]
        self._matched = [0] * len(self.stops)  # chars of each stop the text ends with
        self.pending = ""  # text held back: it may be the start of a stop
        self.hit = ""  # the stop that ended the text, once one did

    def __bool__(self) -> bool:
        return bool(self.stops)

    def feed(self, text: str) -> tuple[str, bool]:
        """Text that may be emitted now, and whether a stop was hit (the
        text before it is then all that is emitted, the rest dropped)."""
        base = len(self.pending)
        self.pending += text
        matched = self._matched
        for i, ch in enumerate(text, base):
            for n, stop in enumerate(self.stops):
                k = matched[n]
                while k and stop[k] != ch:
                    k = self._failure[n][k - 1]
                if stop[k] == ch:
                    k += 1
                if k == len(stop):
                    out = self.pending[: i + 1 - k]
                    self.pending, self.hit = "", stop
                    return out, True
                matched[n] = k
        cut = len(self.pending) - max(matched, default=0)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False
