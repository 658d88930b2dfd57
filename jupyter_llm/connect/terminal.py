"""Text from a model or a server, made safe to print to a terminal.

A model's answer, a model name from a registry or a server's error message
can hold escape sequences that clear the screen, retitle the window, move the
cursor or rewrite what was printed before. Control characters other than
newline and tab (C0, DEL and C1, which some terminals read as escape
introducers) are removed; what is left is shown as text.

Bidirectional controls (Unicode's Bidi_Control characters: the embeddings and
overrides U+202A..U+202E, the isolates U+2066..U+2069, and the marks U+200E,
U+200F, U+061C) reorder what a terminal shows, so printed text can read
differently from what it is (a command that looks harmless, "Trojan Source").
They are shown escaped, as ``\\u202e``; letters of right-to-left scripts are
left as they are (the terminal orders them by their own direction).
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: str) -> str:
    """``text`` without control characters other than newline and tab, and
    with bidirectional controls shown as ``\\uXXXX``."""
    return _BIDI.sub(lambda m: f"\\u{ord(m[0]):04x}", _CONTROL.sub("", text))
