"""Holding back text that may be the start of a marker, as stop strings are."""

from __future__ import annotations

from collections.abc import Iterable

# Blanks a reader holds back (a call or a tag may follow them, and then they
# are dropped) at most: past this they are text. Held whole, a model writing
# only blanks cost every token a copy of them all (0.3 ms at 800k characters).
MAX_HELD_BLANKS = 4096


def held_back(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of ``text`` could be the beginning of
    one of ``markers`` (and so must wait for the next piece)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def find_first(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str]:
    """The position of the first of ``markers`` in ``text`` and which it is;
    ``(-1, "")`` when there is none."""
    best, which = -1, ""
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, marker
    return best, which
