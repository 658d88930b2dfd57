"""keep_alive parsing as BEHAVIOUR.md says: a pure function, table-tested."""

from __future__ import annotations

import math
import re

from jupyter_llm.errors import InvalidRequest

FOREVER = math.inf

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_keep_alive(value: object, field: str = "keep_alive") -> float:
    """Seconds to keep a model loaded; ``FOREVER`` for negative values.

    Numbers are seconds; strings are Go-style durations ("5m", "1h30m", "500ms",
    "-1s") or plain numbers of seconds. Anything else is an ``InvalidRequest``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidRequest(
            f"invalid {field}: {value!r}; expected a number of seconds or a duration like '5m'"
        )
    if isinstance(value, str):
        seconds = _parse_duration(value.strip(), field)
    else:
        seconds = float(value)
    if math.isnan(seconds):
        raise InvalidRequest(f"invalid {field}: {value!r}")
    return FOREVER if seconds < 0 else seconds


def _parse_duration(text: str, field: str) -> float:
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
        raise InvalidRequest(
            f"invalid {field}: {text!r}; expected a number of seconds or a duration like '5m'"
        )
    return sign * total
