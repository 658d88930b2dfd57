"""Which byte sequences are UTF-8 (RFC 3629), one byte at a time.

A grammar counts code points as llama.cpp decodes a token's bytes, and that
decoder takes what UTF-8 forbids (overlong forms, surrogates, code points
past U+10FFFF), which a strict decoder later turns into one replacement
character per byte: a string the grammar bounded to 20 characters then reads
as 60. Constrained output is held to real UTF-8 with this state machine.
Pure: runs in the runner, tested on its own.
"""

from __future__ import annotations

from typing import NamedTuple


class Utf8State(NamedTuple):
    """Where a byte stream stands: continuation bytes still owed, and the
    range the next one must fall in (narrower after E0, ED, F0, F4)."""

    owed: int = 0
    lo: int = 0x80
    hi: int = 0xBF


BOUNDARY = Utf8State()  # between characters: any text may follow


def _lead(byte: int) -> Utf8State | None:
    if byte < 0x80:
        return BOUNDARY
    if 0xC2 <= byte <= 0xDF:
        return Utf8State(1)
    if byte == 0xE0:  # no overlong three-byte forms
        return Utf8State(2, 0xA0, 0xBF)
    if byte == 0xED:  # no surrogates
        return Utf8State(2, 0x80, 0x9F)
    if 0xE1 <= byte <= 0xEF:
        return Utf8State(2)
    if byte == 0xF0:  # no overlong four-byte forms
        return Utf8State(3, 0x90, 0xBF)
    if 0xF1 <= byte <= 0xF3:
        return Utf8State(3)
    if byte == 0xF4:  # nothing past U+10FFFF
        return Utf8State(3, 0x80, 0x8F)
    return None  # a continuation byte, C0/C1, F5..FF


def advance(state: Utf8State, data: bytes) -> Utf8State | None:
    """The state after ``data``, or None when ``data`` breaks UTF-8 there."""
    if state.owed == 0 and data.isascii():
        return state
    for byte in data:
        if state.owed:
            if not state.lo <= byte <= state.hi:
                return None
            state = Utf8State(state.owed - 1) if state.owed > 1 else BOUNDARY
        else:
            lead = _lead(byte)
            if lead is None:
                return None
            state = lead
    return state
