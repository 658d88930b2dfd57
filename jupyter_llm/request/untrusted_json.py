"""Untrusted JSON as a bounded value: the one parser of request bodies (both
APIs) and of the JSON text inside them (OpenAI's tool-call arguments).

RFC 8259 strictly (Python's parser also takes NaN and Infinity, which no
option, duration or runner expects), nested at most ``BODY_DEPTH`` deep, at
most ``JSON_VALUES`` values, and no lone UTF-16 surrogate in any string or
key (``"\\ud800"`` is valid JSON but not text: it cannot be encoded for the
model, and would otherwise surface as a 500 deep inside a handler).

Time on the event loop: the C decoder holds the GIL for its whole call,
about 0.1 s per million values, so running it in a thread still freezes the
server for a body of many small values; a pure-Python decoder shares the GIL
but slows every other request while it runs. So the commas, colons and
brackets of a body are counted first (a bound on its values, at C speed).
Within ``FAST_VALUES`` it is decoded here. Beyond, it is first checked in a
helper process (``helper_process``, at the lowest CPU priority), which
shares no GIL with the server:
only a body found within the bounds is then decoded here, at most
``JSON_VALUES`` values, a few tens of milliseconds. Callers run this off the
loop for any body larger than a few KiB.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_llm.request import helper_process
from jupyter_llm.request.limits import BODY_DEPTH, JSON_VALUES

FAST_VALUES = 1 << 16  # values decoded here without a check first (a few ms of GIL)
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
    value = _bounded(body, "request body", BODY_DEPTH.value)
    if not isinstance(value, dict):
        raise BodyError("request body must be a JSON object")
    return value


def parse_json_text(text: str, where: str, depth_limit: int = BODY_DEPTH.value) -> Any:
    """JSON text found inside a body (``where`` names its field) as a value
    within the same bounds, nested at most ``depth_limit`` deep."""
    return _bounded(text.encode("utf-8", "surrogatepass"), where, depth_limit)


def _bounded(data: bytes, where: str, depth_limit: int) -> Any:
    many = len(data) > 2 * FAST_VALUES and _value_bound(data) > FAST_VALUES
    if many:  # raises unless within the bounds; nothing decoded here until then
        _check_elsewhere(data, where, depth_limit)
    text = _text(data, where)
    if many:
        return json.loads(text)
    value = _decode(text, where)
    check_tree(value, where, depth_limit)
    return value


def _value_bound(data: bytes) -> int:
    """At least the number of values in ``data``: every value but the first
    follows a comma, a colon or an opening bracket."""
    return data.count(b",") + data.count(b":") + data.count(b"[") + 1


def _text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"invalid JSON in {where}: not UTF-8 ({e.reason})") from None


def _decode(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_Constant)
    except RecursionError:
        raise Refused(
            f"invalid JSON in {where}: nested more than {BODY_DEPTH.value} levels; "
            f"the limit is {BODY_DEPTH.value} ({BODY_DEPTH.key})"
        ) from None
    except json.JSONDecodeError as e:
        raise BodyError(f"invalid JSON in {where}: {e}") from None


def check_tree(value: Any, where: str, depth_limit: int = BODY_DEPTH.value) -> int:
    """Walk ``value`` once, iteratively: a ``BodyError`` for nesting past
    ``depth_limit``, more than ``JSON_VALUES`` values, a NaN/Infinity
    constant, or a lone surrogate, naming the field that holds it
    (``messages[0].content``). Returns the values it holds."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    seen = 0
    while stack:
        item, path, depth = stack.pop()
        seen += 1
        if seen > JSON_VALUES.value:
            raise Refused(
                f"{where} has more than {JSON_VALUES.value:,} values; the limit is "
                f"{JSON_VALUES.value:,} values ({JSON_VALUES.key})"
            )
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
    return seen


def _surrogate(where: str, path: str, key: str | None = None) -> str:
    place = f"a key of {path or where}" if key is not None else (path or where)
    return (
        f"invalid JSON in {where}: {place} holds a lone UTF-16 surrogate (\\ud800-\\udfff "
        "without its pair), which is not text"
    )


# -- the check in a helper process -------------------------------------------------------------
def _check_elsewhere(data: bytes, where: str, depth_limit: int) -> None:
    """``_check`` in a helper process (``helper_process``), raising here what it found."""
    problem = helper_process.run(_check, data, where, depth_limit)
    if problem is not None:
        kind, message = problem
        raise (Refused if kind == "refused" else BodyError)(message)


def _check(data: bytes, where: str, depth_limit: int) -> tuple[str, str] | None:
    """In the helper process: what is wrong with ``data``, or None."""
    try:
        check_tree(_decode(_text(data, where), where), where, depth_limit)
    except Refused as e:
        return "refused", str(e)
    except BodyError as e:
        return "invalid", str(e)
    return None
