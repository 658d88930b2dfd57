"""Untrusted JSON as a bounded value: the one parser of request bodies (both
APIs) and of the JSON text inside them (OpenAI's tool-call arguments).

RFC 8259 strictly (Python's parser also takes NaN and Infinity, which no
option, duration or runner expects), nested at most ``BODY_DEPTH`` deep, at
most ``JSON_VALUES`` values, and no lone UTF-16 surrogate in any string or
key (``"\\ud800"`` is valid JSON but not text: it cannot be encoded for the
model, and it used to surface as a 500 deep inside a handler).

Time on the event loop: the C decoder holds the GIL for its whole call, about
0.1 s per million values, so running it in a thread would still freeze the
server for a body of many small values. A body that may hold many values
(counted from its commas, colons and brackets, which bound them) is decoded
by the pure-Python scanner instead, which lets other threads run every few
milliseconds and stops as soon as the count passes ``JSON_VALUES``. Callers
run this off the loop for any body larger than a few KiB.
"""

from __future__ import annotations

import json
import json.scanner
import re
import time
from typing import Any

from jupyter_llm.limits import BODY_DEPTH, JSON_VALUES

FAST_VALUES = 1 << 16  # values the C decoder may take at once (a few ms of GIL)
YIELD_EVERY = 256  # values the counting decoder builds between two GIL hand-overs
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Constant(str):
    """Where the body had NaN, Infinity or -Infinity: kept to name its field."""


class BodyError(ValueError):
    """A body that is not a bounded JSON object; the message is the 400's."""


class Refused(BodyError):
    """Valid JSON that the server refuses: past a bound, or not text."""


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object within this module's bounds, or a
    ``BodyError`` naming what is wrong and where."""
    if not body.strip():
        raise BodyError("request body is empty; expected a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"invalid JSON in request body: not UTF-8 ({e.reason})") from None
    value = _decode(text)
    check_tree(value, "request body")
    if not isinstance(value, dict):
        raise BodyError("request body must be a JSON object")
    return value


def parse_json_text(text: str, where: str, depth_limit: int = BODY_DEPTH.value) -> Any:
    """JSON text found inside a body (``where`` names its field) as a value
    within the same bounds, nested at most ``depth_limit`` deep."""
    try:
        value = _decode(text, where)
    except BodyError as e:
        raise type(e)(str(e).replace("request body", where)) from None
    check_tree(value, where, depth_limit)
    return value


def _decode(text: str, where: str = "request body") -> Any:
    bound = text.count(",") + text.count(":") + text.count("[") + 1
    try:
        if bound <= FAST_VALUES:
            return json.loads(text, parse_constant=_Constant)
        return _CountingDecoder().decode(text)
    except RecursionError:
        raise Refused(
            f"invalid JSON in {where}: nested more than {BODY_DEPTH.value} levels; "
            f"the limit is {BODY_DEPTH.value} ({BODY_DEPTH.key})"
        ) from None
    except json.JSONDecodeError as e:
        raise BodyError(f"invalid JSON in {where}: {e}") from None


class _CountingDecoder(json.JSONDecoder):
    """The pure-Python scanner, counting the values it builds."""

    def __init__(self) -> None:
        super().__init__(parse_constant=_Constant)
        self.values = 0
        for name in ("parse_object", "parse_array", "parse_string", "parse_int", "parse_float"):
            setattr(self, name, self._counted(getattr(self, name)))
        self.scan_once = json.scanner.py_make_scanner(self)

    def _counted(self, parse: Any) -> Any:
        def counted(*args: Any) -> Any:
            self.values += 1
            if not self.values % YIELD_EVERY:
                time.sleep(0)  # hand the GIL to the event loop if it waits
            if self.values > JSON_VALUES.value:
                raise Refused(
                    str(JSON_VALUES.exceeded("request body", self.values)).replace(
                        f"has {self.values:,}", "has more than"
                    )
                )
            return parse(*args)

        return counted


def check_tree(value: Any, where: str, depth_limit: int = BODY_DEPTH.value) -> None:
    """Walk ``value`` once, iteratively: a ``BodyError`` for nesting past
    ``depth_limit``, a NaN/Infinity constant, or a lone surrogate, naming the
    field that holds it (``messages[0].content``)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, _Constant):
            raise BodyError(
                f"invalid JSON in {where}: {path or where}: {item} is not a JSON number"
            )
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise Refused(_surrogate(where, path))
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= depth_limit:
            raise Refused(
                f"invalid JSON in {where}: {path or 'the top level'} nests more than "
                f"{depth_limit} levels; the limit is {depth_limit} ({BODY_DEPTH.key})"
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE.search(key):
                    raise Refused(_surrogate(where, path, key))
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        else:
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))


def _surrogate(where: str, path: str, key: str | None = None) -> str:
    place = f"a key of {path or where}" if key is not None else (path or where)
    return (
        f"invalid JSON in {where}: {place} holds a lone UTF-16 surrogate (\\ud800-\\udfff "
        "without its pair), which is not text"
    )
