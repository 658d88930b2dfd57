"""Tool calls read out of a model's output, finished or streamed.

Each format (``ChatFormat.tool_calls``) is a set of markers that open a
call and a reader for the text from such a marker on:

- ``hermes`` (Qwen2.5/3, Hermes): ``<tool_call>{"name", "arguments"}</tool_call>``,
  several in a row; Qwen3-Coder's ``<function=f><parameter=p>v</parameter></function>``
  body too;
- ``llama3``: a bare ``{"name", "parameters"}`` object as the whole answer,
  or ``<|python_tag|>`` followed by one, or by ``tool.call(arg="v")``;
- ``mistral``: ``[TOOL_CALLS][{"name", "arguments", "id"}]`` and the newer
  ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` / ``[TOOL_CALLS]name[ARGS]{...}``;
- ``deepseek_r1``: DeepSeek's calls-begin, call-begin markers, ``function``,
  the separator marker, the name and a fenced JSON block (``DEEPSEEK_*``);
- ``gpt_oss``: harmony messages addressed ``to=functions.NAME``;
- ``json``, the fallback: an answer that is a JSON call object (or a list of
  them, or fenced), or Hermes tags.

A call that does not parse comes back as content, never as an exception:
the model's output is untrusted (a prompt injection writes it), so JSON is
nested at most ``MAX_NESTING`` deep before a decoder sees it (CPython's
decoder recurses, and ``[`` a thousand times raised RecursionError in the
runner's decode loop), and a call whose values cannot be sent as UTF-8 JSON
(a lone surrogate written as ``\\ud800``, NaN) is content too.
Arguments given as a JSON string are decoded. Text that may be the start of
a marker is held back in a stream until the next piece decides it, as stop
strings are.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from jupyter_llm.chat_formats import harmony
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
    ChatFormat,
)
from jupyter_llm.chat_formats.markers import find_first, held_back
from jupyter_llm.limits import SCHEMA_DEPTH, TOOLS

_DECODER = json.JSONDecoder()

# Levels of ``[``/``{`` a call read from the model's output may nest: the
# bound a request's tool-call arguments have (limits.py), far below CPython's
# recursion limit.
MAX_NESTING = SCHEMA_DEPTH.value
# Calls one bare-JSON answer may hold (as many as a request may offer tools);
# past it the answer is text. Such an answer is read again each time a value
# closes, so its calls are bounded to keep that linear in what was written.
MAX_CALLS = TOOLS.value
# Characters of one call, held back until it closes: past them it is content
# (a call that never closes would otherwise be held, and sent, whole).
MAX_CALL_CHARS = 1 << 20


class TooDeep(ValueError):
    """JSON nested deeper than ``MAX_NESTING``: not decoded, so not a call."""


# a JSON string (closed or not, escapes skipped) or one bracket
_JSON_PART = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


def json_depth(text: str, start: int = 0, limit: int = MAX_NESTING) -> int:
    """How deep the arrays and objects of the JSON value at ``start`` nest,
    counted no further than ``limit + 1``. A linear scan that follows
    strings as a decoder does, so that a decoder is only given what it can
    read without deep recursion. A scalar, or no value, is 0."""
    if start >= len(text) or text[start] not in "[{":
        return 0
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
                break  # the value ends here (or is broken here)
    return deepest


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


@dataclass
class ToolCallDelta:
    """What to emit now: answer text, and the calls completed so far."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __iadd__(self, other: ToolCallDelta) -> ToolCallDelta:
        self.content += other.content
        self.tool_calls += other.tool_calls
        return self


@dataclass(frozen=True)
class ParsedToolCalls:
    content: str
    tool_calls: list[ToolCall]


def parse_tool_calls(
    text: str, fmt: ChatFormat, tool_names: Collection[str] | None = None
) -> ParsedToolCalls:
    """A finished output's answer text and tool calls (see ``ToolCallStream``)."""
    stream = ToolCallStream(fmt, tool_names)
    delta = stream.feed(text)
    delta += stream.finish()
    return ParsedToolCalls(content=delta.content, tool_calls=delta.tool_calls)


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
        except ValueError:
            return None if not final else Take([], len(text))
        found = _calls_from_json(value, bare=True)
        if found is None:
            return Take([], end)
        calls += found
        if len(calls) > MAX_CALLS:
            return Take([], len(text))
        pos = end
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos += 1
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
    at = len(tag) if text.startswith(tag) else 0
    while at < len(text) and text[at].isspace():
        at += 1
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
    at = len(marker)
    while at < len(text) and text[at].isspace():
        at += 1
    if at == len(text):
        return Take([], len(text)) if final else None
    if text[at] in "[{":
        try:
            value, end = raw_decode(text, at)
        except TooDeep:
            return Take([], len(text))
        except ValueError:
            return None if not final else Take([], len(text))
        return Take(_calls_from_json(value) or [], end)
    named = _MISTRAL_NAMED.match(text, at)
    if not named:
        return None if not final and "[ARGS]" not in text else Take([], len(text))
    args_at = named.end()
    while args_at < len(text) and text[args_at].isspace():
        args_at += 1
    try:
        value, end = raw_decode(text, args_at)
    except TooDeep:
        return Take([], len(text))
    except ValueError:
        return None if not final else Take([], len(text))
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


@dataclass(frozen=True)
class _Grammar:
    anywhere: tuple[str, ...]  # markers that open calls wherever they are
    at_start: tuple[str, ...]  # markers that open calls only as the first text
    read: Reader
    ends: str  # a call can only have ended in a piece holding one of these...
    nested: bool  # ...outside strings, back at the top level (JSON, a python call)
    # not nested: the reader only ends a call once one of these is in the text
    # (looked for in what is new, so a long call is not searched again and again)
    closers: tuple[str, ...] = ()


_GRAMMARS: dict[str, _Grammar] = {
    "hermes": _Grammar(
        ("<tool_call>",), (), read_hermes, ">", nested=False, closers=("</tool_call>",)
    ),
    "llama3": _Grammar(("<|python_tag|>",), ("{", "["), read_llama3, "}])", nested=True),
    "mistral": _Grammar(("[TOOL_CALLS]",), (), read_mistral, "}]", nested=True),
    "deepseek_r1": _Grammar(
        (DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALL_BEGIN),
        (),
        read_deepseek,
        ">",
        nested=False,
        closers=(DEEPSEEK_CALLS_END,),
    ),
    "json": _Grammar(("<tool_call>",), ("{", "[", "```"), read_json, "}])>`", nested=True),
}


class _TopLevel:
    """Follows the nesting of brackets outside JSON strings across pieces, so
    that a call's reader runs only when a value may have closed (running it
    on every piece would take time growing with the square of the call)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def closes(self, text: str, ends: str) -> bool:
        closed = False
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[(":
                self.depth += 1
                # past the bound the reader decides at once (content), rather
                # than the whole rest of the output being held back
                closed = closed or self.depth > MAX_NESTING
            elif ch in "}])":
                self.depth = max(self.depth - 1, 0)
                closed = closed or (self.depth == 0 and ch in ends)
            elif ch in ends and self.depth == 0:
                closed = True
        return closed


# -- the stream ----------------------------------------------------------------


class ToolCallStream:
    """Feed output pieces; each call returns the content to emit now and the
    calls completed. ``finish`` flushes what was held back.

    ``tool_names``, the tools the request offered: an answer that is bare
    JSON (Llama 3.x, the fallback) is a call only when it names one of them.
    Calls inside markers come back whatever they name. ``constrained``: a
    tool-call grammar holds the output, so a bare JSON object is a call
    (cut short, it is dropped as a marked call is: see ``finish``)."""

    def __init__(
        self,
        fmt: ChatFormat,
        tool_names: Collection[str] | None = None,
        *,
        constrained: bool = False,
    ) -> None:
        self._fmt = fmt
        self._names = frozenset(tool_names) if tool_names is not None else None
        self._constrained = constrained
        self._bare = False  # the call being read opened without a marker
        self._grammar = _GRAMMARS.get(fmt.tool_calls, _GRAMMARS["json"])
        self._buffer = ""
        self._state: Literal["start", "content", "call", "after_call"] = "start"
        self._harmony = harmony.HarmonyReader() if fmt.tool_calls == "gpt_oss" else None
        self._harmony_body: list[str] = []
        self._top = _TopLevel()
        self._blank = True  # all that is held back is blanks, before a call or in content

    def feed(self, text: str) -> ToolCallDelta:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        self._buffer += text
        if self._blank and text.isspace():
            # blanks held back stay held: not stripped again (quadratic in blanks)
            return ToolCallDelta()
        if self._state == "call" and len(self._buffer) > MAX_CALL_CHARS:
            # no call is this long: what was held goes out, and reading goes on after it
            held, self._buffer, self._state, self._blank = self._buffer, "", "content", True
            return ToolCallDelta(content=held)
        if self._state == "call" and not self._may_close(text):
            return ToolCallDelta()
        out = self._advance(final=False)
        self._blank = self._state in ("start", "content") and (
            not self._buffer or self._buffer.isspace()
        )
        return out

    def _may_close(self, text: str) -> bool:
        grammar = self._grammar
        if grammar.nested:
            return self._top.closes(text, grammar.ends)
        if grammar.closers:
            width = len(text) + max(map(len, grammar.closers)) - 1
            tail = self._buffer[-width:]
            return any(c in tail for c in grammar.closers)
        return any(c in text for c in grammar.ends)

    def finish(self, cut_off: bool = False) -> ToolCallDelta:
        """What was held back. ``cut_off``: the output ended at the token
        limit, so a call not closed was cut short rather than written wrong:
        it is dropped, with a marker's start at the very end, instead of
        going out as content (a client would show the markup as the answer).
        The text before it and the calls that closed stay."""
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish(cut_off))
        return self._advance(final=True, cut_off=cut_off)

    def _advance(self, final: bool, cut_off: bool = False) -> ToolCallDelta:
        out = ToolCallDelta()
        grammar = self._grammar
        while True:
            buf = self._buffer
            if self._state == "start":
                head = buf.lstrip()
                if not head and not final:
                    return out
                if any(head.startswith(m) for m in grammar.at_start):
                    self._enter_call(head)
                    self._bare = not head.startswith(grammar.anywhere)
                elif not final and any(m.startswith(head) for m in grammar.at_start):
                    return out
                else:
                    self._state = "content"
            elif self._state in ("content", "after_call"):
                if self._state == "after_call":
                    buf = self._buffer = buf.lstrip()
                    if not buf:
                        return out
                    self._state = "content"
                at, _ = find_first(buf, grammar.anywhere)
                if at >= 0:
                    out.content += buf[:at].rstrip()
                    self._enter_call(buf[at:])
                    continue
                if final:
                    if cut_off:  # a marker's beginning, where the limit came
                        buf = buf[: len(buf) - held_back(buf, grammar.anywhere)]
                    out.content += buf
                    self._buffer = ""
                    return out
                cut = len(buf[: len(buf) - held_back(buf, grammar.anywhere)].rstrip())
                out.content += buf[:cut]
                self._buffer = buf[cut:]
                return out
            else:
                take = grammar.read(buf, final)
                if take is None:
                    return out
                if take.calls and not self._unknown(take.calls):
                    out.tool_calls += take.calls
                    self._state = "after_call"
                elif final and cut_off and self._held_call(buf):
                    self._state = "content"  # a call cut short: see ``finish``
                else:
                    out.content += buf[: max(take.used, 1)]
                    self._state = "content"
                self._buffer = buf[max(take.used, 1) :]
                if final and not self._buffer:
                    return out

    def _held_call(self, text: str) -> bool:
        """Is ``text``, a call not closed, a call's beginning? One a marker
        opened is; a bare one only where the tool-call grammar took hold of
        it (an object: the grammar's trigger and its forced form), else it
        is an answer (a format's JSON, a fenced block)."""
        return not self._bare or (self._constrained and text.startswith("{"))

    def _unknown(self, calls: list[ToolCall]) -> bool:
        """A bare JSON answer is a call only to a tool the request offered."""
        return (
            self._bare and self._names is not None and any(c.name not in self._names for c in calls)
        )

    def _enter_call(self, text: str) -> None:
        self._buffer, self._state = text, "call"
        self._bare = False
        self._top = _TopLevel()
        self._top.closes(text, self._grammar.ends)

    def _from_harmony(self, events: list[harmony.Event]) -> ToolCallDelta:
        out = ToolCallDelta()
        for event in events:
            recipient = event.header.recipient
            if not recipient:
                if event.kind == "text":
                    out.content += event.text
            elif event.kind == "header":
                self._harmony_body = []
            elif event.kind == "text":
                self._harmony_body.append(event.text)
            elif recipient.startswith("functions."):
                body = "".join(self._harmony_body)
                call = call_from_object({"name": recipient[len("functions.") :], "arguments": body})
                if event.kind == "cut" and not body.strip():
                    call = None  # cut before its arguments began: not a call without any
                if call is not None:
                    out.tool_calls.append(call)
                elif event.kind != "cut":  # a call the limit cut short is dropped
                    out.content += harmony.serialize_header(event.header) + body
            # a message to a built-in tool (python, browser) the request did not offer: dropped
        return out
