"""Thinking split from the answer: ``<think>...</think>`` (Qwen3, QwQ,
DeepSeek-R1) and gpt-oss's analysis channel, for a finished output and for
a stream of pieces.

For tag-style thinking the output may start inside thinking, when the
template already opened ``<think>`` in the prompt (``prompt_opens_thinking``
says so); it then only closes it. Thinking the model never closed (it ran
out of tokens) is all thinking. For harmony output, tool-call messages (those
with a recipient) are passed on in the content as harmony text, for the
tool-call parser to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from jupyter_llm.chat_formats import harmony
from jupyter_llm.chat_formats.detect import ChatFormat
from jupyter_llm.chat_formats.markers import MAX_HELD_BLANKS, held_back


@dataclass
class ThinkingDelta:
    """What to emit now: thinking text and answer text."""

    thinking: str = ""
    content: str = ""

    def __iadd__(self, other: ThinkingDelta) -> ThinkingDelta:
        self.thinking += other.thinking
        self.content += other.content
        return self


@dataclass(frozen=True)
class SplitOutput:
    thinking: str
    content: str


def split_thinking(text: str, fmt: ChatFormat, *, starts_in_thinking: bool = False) -> SplitOutput:
    """A finished output's thinking and answer."""
    stream = ThinkingStream(fmt, starts_in_thinking=starts_in_thinking)
    delta = stream.feed(text)
    delta += stream.finish()
    return SplitOutput(thinking=delta.thinking, content=delta.content)


class ThinkingStream:
    """Feed output pieces; each call returns the thinking and content
    deltas that can be emitted now. Text that may be the start of a marker
    is held back until the next piece decides it. A format without
    thinking passes everything through as content."""

    def __init__(self, fmt: ChatFormat, *, starts_in_thinking: bool = False) -> None:
        self._fmt = fmt
        self._buffer = ""
        self._state: Literal["start", "lead", "thinking", "after", "content"] = (
            "lead" if starts_in_thinking and fmt.thinking == "tags" else "start"
        )
        self._harmony = harmony.HarmonyReader() if fmt.thinking == "harmony" else None
        self._blank = False  # all that is held back is blanks (before or in thinking)

    def feed(self, text: str) -> ThinkingDelta:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        if self._fmt.thinking != "tags":
            return ThinkingDelta(content=text)
        self._buffer += text
        if self._blank and text.isspace():
            # blanks held back stay held: not stripped again (quadratic in blanks)
            if len(self._buffer) <= MAX_HELD_BLANKS:
                return ThinkingDelta()
            held, self._buffer = self._buffer, ""  # so many blanks are text
            if self._state == "thinking":
                return ThinkingDelta(thinking=held)
            self._state = "content"
            return ThinkingDelta(content=held)
        out = self._advance(final=False)
        self._blank = self._state in ("start", "thinking") and (
            not self._buffer or self._buffer.isspace()
        )
        return out

    def finish(self, cut_off: bool = False) -> ThinkingDelta:
        """What was held back; ``cut_off``: the output ended at the token
        limit (a harmony message it cut is passed on unclosed, for the
        tool-call reader to judge: ``HarmonyReader.finish``)."""
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish(cut_off))
        if self._fmt.thinking != "tags":
            return ThinkingDelta()
        head = self._buffer.lstrip()
        tags = (self._fmt.think_open, self._fmt.think_close)
        if cut_off and self._state == "start" and head and any(t.startswith(head) for t in tags):
            self._buffer = ""  # a tag's beginning where the limit came
        return self._advance(final=True)

    def _advance(self, final: bool) -> ThinkingDelta:
        out = ThinkingDelta()
        opener, closer = self._fmt.think_open, self._fmt.think_close
        while True:
            buf = self._buffer
            if self._state == "start":
                head = buf.lstrip()
                if head.startswith(opener):
                    self._buffer, self._state = head[len(opener) :], "lead"
                elif head.startswith(closer):  # the prompt had opened it after all
                    self._buffer, self._state = head[len(closer) :], "after"
                elif not final and (not head or opener.startswith(head) or closer.startswith(head)):
                    return out
                else:
                    self._state = "content"
            elif self._state in ("lead", "thinking"):
                if self._state == "lead":
                    buf = self._buffer = buf.lstrip()
                    if not buf:
                        return out
                    self._state = "thinking"
                at = buf.find(closer)
                if at >= 0:
                    out.thinking += buf[:at].rstrip()
                    self._buffer, self._state = buf[at + len(closer) :], "after"
                    continue
                if final:
                    out.thinking += buf.rstrip()
                    self._buffer = ""
                    return out
                cut = len(buf[: len(buf) - held_back(buf, (closer,))].rstrip())
                out.thinking += buf[:cut]
                self._buffer = buf[cut:]
                return out
            elif self._state == "after":
                buf = self._buffer = buf.lstrip()
                if not buf:
                    return out
                self._state = "content"
            else:
                out.content += buf
                self._buffer = ""
                return out

    def _from_harmony(self, events: list[harmony.Event]) -> ThinkingDelta:
        out = ThinkingDelta()
        for event in events:
            header = event.header
            addressed = bool(header.recipient)
            if event.kind == "header" and addressed:
                out.content += harmony.serialize_header(header)
            elif event.kind == "end" and addressed:
                out.content += "<|call|>"
            elif event.kind == "text":
                if header.channel == "analysis" and not addressed:
                    out.thinking += event.text
                else:
                    out.content += event.text
        return out
