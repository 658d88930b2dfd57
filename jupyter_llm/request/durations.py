"""Durations as clients and configuration write them: a pure function, table-tested.

It raises a plain ``ValueError`` (the message is what a user should read),
which the HTTP edge
(``api/requests.py``) turns into a 400 and ``config.py`` into a ``ConfigError``.
"""

from __future__ import annotations

import math
import re

FOREVER = math.inf
# Longer than this is forever. A finite keep_alive becomes an expiry date in
# /api/ps (and the sidebar); one past the year 9999 cannot be written, and no
# one waits a century for a model to unload.
LONGEST = 100 * 365.25 * 86400

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object, field: str = "keep_alive") -> float:
    """Seconds (``keep_alive``, ``load_timeout``); ``FOREVER`` for negative
    values and for anything longer than ``LONGEST``.

    Numbers are seconds; strings are Go-style durations ("5m", "1h30m", "500ms",
    "-1s") or plain numbers of seconds. Anything else is a ``ValueError`` naming
    ``field`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(_invalid(field, value))
    if isinstance(value, str):
        seconds = _parse_text(value.strip(), field)
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an integer beyond any float: forever, either way
            return FOREVER
    if math.isnan(seconds):
        raise ValueError(f"invalid {field}: {value!r}")
    return FOREVER if seconds < 0 or seconds > LONGEST else seconds


def _invalid(field: str, value: object) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"invalid {field}: {shown}; expected a number of seconds or a duration like '5m'"


def _parse_text(text: str, field: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    sign = 1.0
    body = text
    if body[:1] in "+-" and body:
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    total, pos = 0.0, 0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise ValueError(_invalid(field, text))
    return sign * total
