"""One model output read whole: thinking split off first, then tool calls
read from the answer. This is the one object the APIs need per generation."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from jupyter_llm.chat_formats.detect import ChatFormat
from jupyter_llm.chat_formats.thinking import ThinkingStream
from jupyter_llm.chat_formats.tool_calls import ToolCall, ToolCallStream


@dataclass
class OutputDelta:
    """What to emit now."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __iadd__(self, other: OutputDelta) -> OutputDelta:
        self.content += other.content
        self.thinking += other.thinking
        self.tool_calls += other.tool_calls
        return self

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls)


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    thinking: str
    tool_calls: list[ToolCall]


class OutputStream:
    """Feed the generated text piece by piece; each call returns the
    content, thinking and completed tool calls to emit now; ``finish`` at
    the end flushes what was held back.

    ``tools``: the request offered tools, so tool calls are looked for (a
    gpt-oss output is always read as harmony, and a call it makes comes back
    even so). ``starts_in_thinking``: the prompt opened ``<think>``
    (``prompt_opens_thinking``). ``split_thinking`` False leaves thinking in
    the content, as the model wrote it. ``tool_names``: the offered tools'
    names (see ``ToolCallStream``). ``constrained``: a tool-call grammar
    holds the output (``ToolCallStream``).
    """

    def __init__(
        self,
        fmt: ChatFormat,
        *,
        tools: bool,
        starts_in_thinking: bool = False,
        split_thinking: bool = True,
        tool_names: Collection[str] | None = None,
        constrained: bool = False,
    ) -> None:
        self._thinking = (
            ThinkingStream(fmt, starts_in_thinking=starts_in_thinking) if split_thinking else None
        )
        wanted = tools or fmt.tool_calls == "gpt_oss"
        self._tools = ToolCallStream(fmt, tool_names, constrained=constrained) if wanted else None

    def feed(self, text: str) -> OutputDelta:
        if self._thinking is None:
            return self._answer(text, final=False)
        split = self._thinking.feed(text)
        out = self._answer(split.content, final=False)
        out.thinking = split.thinking
        return out

    def finish(self, cut_off: bool = False) -> OutputDelta:
        """What was held back. ``cut_off``: the output ended at the token
        limit; a call it cut short is dropped, not sent as content
        (``ToolCallStream.finish``)."""
        if self._thinking is None:
            return self._answer("", final=True, cut_off=cut_off)
        split = self._thinking.finish(cut_off)
        out = self._answer(split.content, final=True, cut_off=cut_off)
        out.thinking = split.thinking
        return out

    def _answer(self, text: str, final: bool, cut_off: bool = False) -> OutputDelta:
        if self._tools is None:
            return OutputDelta(content=text)
        delta = self._tools.feed(text)
        if final:
            delta += self._tools.finish(cut_off)
        return OutputDelta(content=delta.content, tool_calls=delta.tool_calls)


def parse_output(
    text: str,
    fmt: ChatFormat,
    *,
    tools: bool,
    starts_in_thinking: bool = False,
    split_thinking: bool = True,
    tool_names: Collection[str] | None = None,
    constrained: bool = False,
    cut_off: bool = False,
) -> ParsedOutput:
    """A finished output's answer, thinking and tool calls; ``cut_off``: it
    ended at the token limit (``OutputStream.finish``)."""
    stream = OutputStream(
        fmt,
        tools=tools,
        starts_in_thinking=starts_in_thinking,
        split_thinking=split_thinking,
        tool_names=tool_names,
        constrained=constrained,
    )
    out = stream.feed(text)
    out += stream.finish(cut_off)
    return ParsedOutput(content=out.content, thinking=out.thinking, tool_calls=out.tool_calls)
