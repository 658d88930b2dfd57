"""The UTF-8 state machine that constrained output is held to (issue 24):
it agrees with Python's strict decoder on every byte string, whole or cut
anywhere, so what the grammar counts is what ``json.loads`` reads."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_llm.runner.utf8 import BOUNDARY, advance


def python_reads(data: bytes) -> str:
    """'whole', 'prefix' (valid so far: some bytes finish the character) or
    'broken'. CPython's incremental decoder waits for a surrogate's third
    byte (ED A0 passes, though nothing can follow it), so a prefix is one
    that some continuation byte, then 80s, makes whole: only the byte after
    a lead byte has a narrower range (after E0, ED, F0, F4)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data)
    except UnicodeDecodeError:
        return "broken"
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return "prefix" if _can_finish(data) else "broken"
    return "whole"


def _can_finish(data: bytes) -> bool:
    for owed in (1, 2, 3):
        for byte in range(0x80, 0xC0):
            try:
                (data + bytes([byte]) + b"\x80" * (owed - 1)).decode()
                return True
            except UnicodeDecodeError:
                continue
    return False


def ours(data: bytes) -> str:
    state = advance(BOUNDARY, data)
    return "broken" if state is None else "whole" if state == BOUNDARY else "prefix"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "whole"),
        (b"plain", "whole"),
        ("é€😀".encode(), "whole"),
        ("😀".encode()[:3], "prefix"),
        (b"\xc3", "prefix"),
        (b"\x80", "broken"),  # a continuation byte first
        (b"\xc1\x81", "broken"),  # overlong 'A'
        (b"\xc0\xa2", "broken"),  # overlong quote
        (b"\xe0\x80\xa2", "broken"),  # overlong three-byte form
        (b"\xf0\x80\x80\xa2", "broken"),  # overlong four-byte form
        (b"\xed\xa0\x80", "broken"),  # a surrogate, U+D800
        (b"\xed\xa0", "broken"),  # its start: no byte can finish it
        (b"\xed\x9f\xbf", "whole"),  # U+D7FF, just below
        (b"\xf4\x90\x80\x80", "broken"),  # past U+10FFFF
        (b"\xf4\x8f\xbf\xbf", "whole"),  # U+10FFFF itself
        (b"\xf5\x80\x80\x80", "broken"),
        (b"\xff", "broken"),
        (b"\xc3\x28", "broken"),  # a lead byte not continued
    ],
)
def test_known_sequences(data, expected):
    assert ours(data) == expected == python_reads(data)


@given(st.binary(max_size=12))
def test_agrees_with_python_on_any_bytes(data):
    assert ours(data) == python_reads(data)


@given(st.text(max_size=8), st.integers(0, 40))
def test_text_cut_anywhere_is_a_prefix_and_goes_on_where_it_was_cut(text, cut):
    data = text.encode()
    cut = min(cut, len(data))
    state = advance(BOUNDARY, data[:cut])
    assert state is not None
    assert advance(state, data[cut:]) == BOUNDARY
