"""Text from a model or a server, made safe to print to a terminal.

A model's answer, a model name from a registry or a server's error message
can hold escape sequences that clear the screen, retitle the window, move the
cursor or rewrite what was printed before. Control characters other than
newline and tab (C0, DEL and C1, which some terminals read as escape
introducers) are removed; what is left is shown as text.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_text(text: str) -> str:
    """``text`` without control characters other than newline and tab."""
    return _CONTROL.sub("", text)
