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

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal

from jupyter_llm.chat_formats import harmony
from jupyter_llm.chat_formats.bounded_json import MAX_NESTING
from jupyter_llm.chat_formats.call_readers import (
    Reader,
    ToolCall,
    call_from_object,
    read_deepseek,
    read_hermes,
    read_json,
    read_llama3,
    read_mistral,
)
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    ChatFormat,
)
from jupyter_llm.chat_formats.markers import MAX_HELD_BLANKS, find_first, held_back

# Characters of one call, held back until it closes: past them it is content
# (a call that never closes would otherwise be held, and sent, whole).
MAX_CALL_CHARS = 1 << 20


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


_PAIRS = {"}": "{", "]": "[", ")": "("}
FENCE = "```"


class _TopLevel:
    """Follows the nesting of brackets outside JSON strings across pieces, so
    that a call's reader runs only when a value may have closed (running it
    on every piece would take time growing with the square of the call).
    Each closer must match its opener: one that does not, or one with
    nothing open, makes the text ``broken`` (no call, however it goes on),
    where counting alone let ``{)`` then ``[]`` run the reader over the
    whole held text at every token (100 ms a token at 800k characters)."""

    def __init__(self) -> None:
        self.open: list[str] = []
        self.in_string = False
        self.escaped = False
        self.broken = False

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
                self.open.append(ch)
                # past the bound the reader decides at once (content), rather
                # than the whole rest of the output being held back
                closed = closed or len(self.open) > MAX_NESTING
            elif ch in _PAIRS:
                if not self.open or self.open.pop() != _PAIRS[ch]:
                    self.broken = True
                    return True
                closed = closed or (not self.open and ch in ends)
            elif ch in ends and not self.open:
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
        self._harmony_body: list[str] = []  # a message to a tool, held whole...
        self._harmony_size = 0  # ...up to MAX_CALL_CHARS
        self._spilled = False  # past it: the rest of the message goes out as content
        self._top = _TopLevel()
        self._blank = True  # all that is held back is blanks, before a call or in content

    def feed(self, text: str) -> ToolCallDelta:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        self._buffer += text
        if self._blank and text.isspace():
            # blanks held back stay held: not stripped again (quadratic in blanks)
            if len(self._buffer) <= MAX_HELD_BLANKS:
                return ToolCallDelta()
            held, self._buffer = self._buffer, ""  # so many blanks are the answer's
            self._state = "content"
            return ToolCallDelta(content=held)
        if self._state == "call" and len(self._buffer) > MAX_CALL_CHARS:
            # no call is this long: what was held goes out, and reading goes on after it
            return self._release()
        if self._state == "call" and not self._may_close(text):
            return ToolCallDelta()
        if self._state == "call" and self._top.broken:  # brackets no call closes: content
            return self._release()
        out = self._advance(final=False)
        self._blank = self._state in ("start", "content") and (
            not self._buffer or self._buffer.isspace()
        )
        return out

    def _release(self) -> ToolCallDelta:
        """The held call is none: it goes out, and reading goes on after it."""
        held, self._buffer, self._state, self._blank = self._buffer, "", "content", True
        return ToolCallDelta(content=held)

    def _may_close(self, text: str) -> bool:
        grammar = self._grammar
        if self._buffer.startswith(FENCE):  # a fenced block closes at its fence, not a bracket
            # (code in it may hold an odd '"', which bracket counting would take for a string)
            start = max(len(FENCE), len(self._buffer) - len(text) - len(FENCE) + 1)
            return FENCE in self._buffer[start:]
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
                self._harmony_body, self._harmony_size, self._spilled = [], 0, False
            elif self._spilled:  # past MAX_CALL_CHARS: the message is content
                out.content += event.text if event.kind == "text" else ""
            elif event.kind == "text":
                self._harmony_body.append(event.text)
                self._harmony_size += len(event.text)
                if self._harmony_size > MAX_CALL_CHARS:  # no call is this long: it goes out
                    out.content += harmony.serialize_header(event.header)
                    out.content += "".join(self._harmony_body)
                    self._harmony_body, self._spilled = [], True
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
