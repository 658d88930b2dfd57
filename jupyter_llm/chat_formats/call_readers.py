"""Each tool-call format's reader: the text from a marker on, made into calls.

A reader returns a ``Take`` (the calls and the characters they used; no calls
means the text is content) or None while it needs more text. A call that does
not parse is content, never an exception.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.chat_formats.bounded_json import (
    TooDeep,
    loads,
    raw_decode,
    sendable,
    value_closed,
)
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
)
from jupyter_llm.request.limits import TOOLS

# Calls one bare-JSON answer may hold (as many as a request may offer tools);
# past it the answer is text. Such an answer is read again each time a value
# closes, so its calls are bounded to keep that linear in what was written.
MAX_CALLS = TOOLS.value


def new_call_id() -> str:
    return "call_" + secrets.token_hex(4)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)

    def openai(self, index: int = 0) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` entry (arguments a JSON string)."""
        return {
            "index": index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }

    def ollama(self, index: int = 0) -> dict[str, Any]:
        """The call as Ollama's ``message.tool_calls`` entry (arguments an object)."""
        return {
            "id": self.id,
            "function": {"index": index, "name": self.name, "arguments": self.arguments},
        }


# -- one call object ---------------------------------------------------------


def call_from_object(obj: Any, call_id: str | None = None) -> ToolCall | None:
    """``{"name", "arguments" | "parameters", "id"?}`` (or OpenAI's
    ``{"function": {...}}``) as a call; None when it is not one."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = {**obj["function"], "id": obj.get("id", obj["function"].get("id"))}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = decode_arguments(obj.get("arguments", obj.get("parameters")))
    if arguments is None:
        return None
    given_id = obj.get("id")
    if isinstance(given_id, str) and given_id:
        call_id = given_id
    if not sendable(name, arguments, call_id):
        return None
    return ToolCall(name=name, arguments=arguments, id=call_id or new_call_id())


def decode_arguments(arguments: Any) -> dict[str, Any] | None:
    """Arguments as an object: a JSON string is decoded, none is ``{}``;
    None when they are not an object."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments)
        except ValueError:
            return None
    return arguments if isinstance(arguments, dict) else None


def _calls_from_json(value: Any, bare: bool = False) -> list[ToolCall] | None:
    """One call object, a list of them, or ``{"tool_calls": [...]}``. A
    ``bare`` value (the whole answer, no marker around it) must also name
    its arguments, so that an answer such as ``{"name": "Bob"}`` stays an
    answer."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    if bare and not all(_names_arguments(item) for item in items):
        return None
    calls = [call_from_object(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _names_arguments(item: Any) -> bool:
    if isinstance(item, dict) and isinstance(item.get("function"), dict):
        item = item["function"]
    return isinstance(item, dict) and ("arguments" in item or "parameters" in item)


# -- readers: text from a marker on -> calls ---------------------------------


@dataclass(frozen=True)
class Take:
    """What a reader made of the text from a marker on: the calls and how
    many characters they used; no calls means the text there is not a
    call, and the characters used go out as content."""

    calls: list[ToolCall]
    used: int


Reader = Callable[[str, bool], Take | None]  # (text, final) -> Take, or None: need more

_BLANKS = re.compile(r"\s*")  # a run of blanks, skipped in C (a reader runs at many tokens)


def _json_values(text: str, at: int, final: bool, separators: str = ";") -> Take | None:
    """Consecutive JSON call values from ``at``, separated by whitespace or
    ``separators``; they end where the text ends."""
    calls: list[ToolCall] = []
    pos = at
    while True:
        try:
            value, end = raw_decode(text, pos)
        except TooDeep:
            return Take([], len(text))  # never a call, however it goes on
        except ValueError:  # open: wait for more; closed: broken, not a call
            return None if not final and not value_closed(text, pos) else Take([], len(text))
        found = _calls_from_json(value, bare=True)
        if found is None:
            return Take([], end)
        calls += found
        if len(calls) > MAX_CALLS:
            return Take([], len(text))
        pos = end
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos = _BLANKS.match(text, pos + 1).end()  # a run at C speed: read at every token
        if pos == len(text):
            return Take(calls, pos) if final else None
        if text[pos] not in "{[":
            return Take(calls, pos)


_FUNCTION_XML = re.compile(r"\s*<function=([^>\s]+)>(.*?)</function>\s*$", re.S)
_PARAMETER_XML = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)


def _xml_call(body: str) -> ToolCall | None:
    """Qwen3-Coder's ``<function=f><parameter=p>value</parameter></function>``;
    each value is JSON when it parses as JSON, else the text."""
    match = _FUNCTION_XML.match(body)
    if not match:
        return None
    params = match.group(2)
    # up to the last closing tag: an opening tag after it would make the
    # search run to the end once per opening (quadratic in what the model wrote)
    last = params.rfind("</parameter>")
    params = params[: last + len("</parameter>")] if last >= 0 else ""
    arguments: dict[str, Any] = {}
    for key, raw in _PARAMETER_XML.findall(params):
        try:
            arguments[key] = loads(raw)
        except ValueError:
            arguments[key] = raw
    if not sendable(match.group(1), arguments):
        return None
    return ToolCall(name=match.group(1), arguments=arguments)


def _tagged_body(body: str) -> list[ToolCall] | None:
    body = body.strip()
    try:
        return _calls_from_json(loads(body))
    except ValueError:
        call = _xml_call(body)
        return [call] if call else None


def read_hermes(text: str, final: bool) -> Take | None:
    opener, closer = "<tool_call>", "</tool_call>"
    end = text.find(closer)
    if end < 0:
        if not final:
            return None
        calls = _tagged_body(text[len(opener) :])  # the model stopped before the closing tag
        return Take(calls or [], len(text))
    calls = _tagged_body(text[len(opener) : end])
    return Take(calls or [], end + len(closer))


_PYTHON_CALL = re.compile(r"\s*([A-Za-z_][\w.]*)\.call\((.*)\)\s*$", re.S)


def _python_call(text: str) -> ToolCall | None:
    """Llama 3.1's built-in tool form ``name.call(arg="value", ...)``, read
    as literals only (never evaluated)."""
    match = _PYTHON_CALL.match(text)
    if not match:
        return None
    try:
        call = ast.parse(f"f({match.group(2)})", mode="eval").body
        assert isinstance(call, ast.Call) and not call.args
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError, AssertionError, TypeError, RecursionError, MemoryError):
        return None  # MemoryError: CPython's parser refusing deep nesting, not the machine's
    if None in arguments or not sendable(arguments):  # **kwargs; bytes, sets
        return None
    return ToolCall(name=match.group(1), arguments=arguments)


def read_llama3(text: str, final: bool) -> Take | None:
    tag = "<|python_tag|>"
    at = _BLANKS.match(text, len(tag) if text.startswith(tag) else 0).end()
    if at == len(text):
        return Take([], len(text)) if final else None
    if text[at] in "{[":
        return _json_values(text, at, final)
    if not final:
        return None
    call = _python_call(text[at:])
    return Take([call] if call else [], len(text))


_MISTRAL_NAMED = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\]\s*([A-Za-z0-9_\-]*))?\s*\[ARGS\]")


def read_mistral(text: str, final: bool) -> Take | None:
    marker = "[TOOL_CALLS]"
    at = _BLANKS.match(text, len(marker)).end()
    if at == len(text):
        return Take([], len(text)) if final else None
    if text[at] in "[{":
        try:
            value, end = raw_decode(text, at)
        except TooDeep:
            return Take([], len(text))
        except ValueError:  # open: wait for more; closed: broken, not a call
            return None if not final and not value_closed(text, at) else Take([], len(text))
        return Take(_calls_from_json(value) or [], end)
    named = _MISTRAL_NAMED.match(text, at)
    if not named:
        return None if not final and "[ARGS]" not in text else Take([], len(text))
    args_at = _BLANKS.match(text, named.end()).end()
    try:
        value, end = raw_decode(text, args_at)
    except TooDeep:
        return Take([], len(text))
    except ValueError:
        broken = args_at < len(text) and value_closed(text, args_at)
        return None if not final and not broken else Take([], len(text))
    call = call_from_object({"name": named.group(1), "arguments": value, "id": named.group(2)})
    return Take([call] if call else [], end)


_DEEPSEEK_CALL = re.compile(
    re.escape(DEEPSEEK_CALL_BEGIN) + "(.*?)" + re.escape(DEEPSEEK_CALL_END), re.S
)


def _fenced(text: str) -> tuple[str, str] | None:
    """``name`` on one line, then a fenced block (R1's call): the name and
    the block's text. Read by hand: the regular expression this replaces
    took time cubic in a run of spaces (4,000 spaces, a minute)."""
    text = text.strip()
    fence = text.find("\n```")
    if fence < 0 or len(text) < fence + 7 or not text.endswith("```"):
        return None
    name = text[:fence].strip()
    if not name or "\n" in name:
        return None
    body = text[fence + 4 : -3]
    return name, body.removeprefix("json").strip()


def _deepseek_call(segment: str) -> ToolCall | None:
    """R1's ``function<sep>name`` and a fenced JSON block, or V3.1's
    ``name<sep>{JSON}``."""
    left, sep, right = segment.partition(DEEPSEEK_SEP)
    if not sep:
        return None
    fenced = _fenced(right)
    if fenced:
        name, arguments = fenced
    else:
        name, arguments = left.strip(), right.strip()
    return call_from_object({"name": name, "arguments": arguments})


def read_deepseek(text: str, final: bool) -> Take | None:
    end = text.find(DEEPSEEK_CALLS_END)
    if end < 0 and not final:
        return None
    used = len(text) if end < 0 else end + len(DEEPSEEK_CALLS_END)
    last = text.rfind(DEEPSEEK_CALL_END, 0, used)  # as in _xml_call: no opening past it
    segments = _DEEPSEEK_CALL.findall(text[: last + len(DEEPSEEK_CALL_END)]) if last >= 0 else []
    calls = [_deepseek_call(segment) for segment in segments]
    if not calls or None in calls:
        return Take([], used)
    return Take([c for c in calls if c is not None], used)


def read_json(text: str, final: bool) -> Take | None:
    if text.startswith("<tool_call>"):
        return read_hermes(text, final)
    if text.startswith("```"):
        newline = text.find("\n")
        fence_end = text.find("```", newline + 1) if newline >= 0 else -1
        if fence_end < 0:
            return None if not final else Take([], len(text))
        calls = _calls_from_json_text(text[newline + 1 : fence_end])
        return Take(calls or [], fence_end + 3)
    return _json_values(text, 0, final)


def _calls_from_json_text(text: str) -> list[ToolCall] | None:
    try:
        return _calls_from_json(loads(text), bare=True)
    except ValueError:
        return None
