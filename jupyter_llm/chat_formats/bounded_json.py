"""JSON from a model's output, read within bounds.

The output is untrusted (a prompt injection writes it): a value is nested at
most ``MAX_NESTING`` deep before a decoder sees it (CPython's decoder
recurses, and ``[`` a thousand times raised RecursionError in the runner's
decode loop), and ``sendable`` says whether values can go out as UTF-8 JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_llm.request.limits import SCHEMA_DEPTH

_DECODER = json.JSONDecoder()

# Levels of ``[``/``{`` a call read from the model's output may nest: the
# bound a request's tool-call arguments have (limits.py), far below CPython's
# recursion limit.
MAX_NESTING = SCHEMA_DEPTH.value


class TooDeep(ValueError):
    """JSON nested deeper than ``MAX_NESTING``: not decoded, so not a call."""


# a JSON string (closed or not, escapes skipped) or one bracket
_JSON_PART = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


def _brackets(text: str, start: int, limit: int) -> tuple[int, bool]:
    """How deep the array or object at ``start`` nests (counted no further
    than ``limit + 1``), and whether it closed: a linear scan that follows
    strings as a decoder does. A scalar, or no value: (0, False)."""
    if start >= len(text) or text[start] not in "[{":
        return 0, False
    depth = deepest = 0
    for part in _JSON_PART.finditer(text, start):
        bracket = part.group()
        if bracket in ("[", "{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif bracket in ("]", "}"):
            depth -= 1
            if depth <= 0:
                return deepest, True  # the value ends here (or is broken here)
    return deepest, False


def json_depth(text: str, start: int = 0, limit: int = MAX_NESTING) -> int:
    """How deep the arrays and objects of the JSON value at ``start`` nest,
    counted no further than ``limit + 1``, so that a decoder is only given
    what it can read without deep recursion. A scalar, or no value, is 0."""
    return _brackets(text, start, limit)[0]


def value_closed(text: str, start: int) -> bool:
    """Has the array or object at ``start`` closed (its brackets, outside
    strings, back to none open)? A value that closed and still does not
    decode is broken, however the output goes on: its reader says so at
    once rather than waiting (and reading the held text again) for more."""
    return _brackets(text, start, len(text))[1]


def _check_depth(text: str, at: int) -> None:
    if json_depth(text, at) > MAX_NESTING:
        raise TooDeep(f"nested deeper than {MAX_NESTING} levels")


def raw_decode(text: str, at: int) -> tuple[Any, int]:
    """``JSONDecoder.raw_decode`` of the value at ``at``; ``ValueError`` (or
    ``TooDeep``) when it is not one, however the model wrote it."""
    _check_depth(text, at)
    try:
        return _DECODER.raw_decode(text, at)
    except RecursionError as e:  # not expected past the depth check
        raise TooDeep(str(e)) from None


def loads(text: str) -> Any:
    """``json.loads`` within ``MAX_NESTING``: ``ValueError`` as for any text
    that is not JSON."""
    _check_depth(text, len(text) - len(text.lstrip(" \t\n\r")))
    try:
        return json.loads(text)
    except RecursionError as e:
        raise TooDeep(str(e)) from None


def sendable(*values: Any) -> bool:
    """Can these values go out as JSON in UTF-8 (the runner's replies, the
    API's answers)? Not with a lone surrogate (``"\\ud800"`` decodes to one),
    NaN/Infinity, which JSON does not have, or a Python literal JSON has no
    form for (bytes, a set)."""
    try:
        json.dumps(values, ensure_ascii=False, allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        return False
    return True
