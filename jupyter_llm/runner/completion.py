"""A completion's replies: its text and thinking as ``token`` messages (grouped
in time, with their log-probabilities), its tool calls, then one ``done`` or
``error``; and the error reply of any request."""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from jupyter_llm.chat_formats import OutputDelta, OutputStream
from jupyter_llm.runner.protocol import (
    ALLOCATION,
    INVALID,
    AllocationError,
    Done,
    EngineError,
    Error,
    InputError,
    Token,
    ToolCallsReply,
    compact,
    fields_of,
)

# Characters of one token message: even escaped (6 bytes a character at most)
# its line stays far below the server's limit on a reply line (64 MiB).
PART_CHARS = 1 << 20
# Logprobs entries held at most (about 1.2 KB each with 20 alternatives): they
# go with their text, but a reader may hold text back for long (blanks before
# a call, a harmony header), and one reply line over the server's limit would
# end the whole runner
LOGPROBS_HELD = 256

Send = Callable[[dict[str, Any]], None]


class TokenStream:
    """Sends generated text at most every ``interval`` seconds (the first piece
    at once). A slow model's tokens go out one by one; a fast model's are
    grouped, so the server and the client wake up less often and take less CPU
    from the decode threads. Text is never held longer than one token's time
    past the interval. Answer text and thinking are grouped apart: ``send``
    gets ``(text)``, or ``(text, thinking)`` once thinking was added."""

    def __init__(
        self,
        send: Callable[..., None],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._interval = interval
        self._clock = clock
        self._parts: list[str] = []
        self._thinking: list[str] = []
        self._last = -interval

    def add(self, text: str, thinking: str = "") -> None:
        if text:
            self._parts.append(text)
        if thinking:
            self._thinking.append(thinking)
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            self.flush()

    def flush(self) -> None:
        text, thinking = "".join(self._parts), "".join(self._thinking)
        self._parts.clear()  # first: text that cannot be sent is not tried again
        self._thinking.clear()
        # text held back long (an unclosed call read as content at the end) goes in
        # parts: one reply line over the server's limit would end the whole runner
        for at in range(0, max(len(text), len(thinking)), PART_CHARS):
            part, more = text[at : at + PART_CHARS], thinking[at : at + PART_CHARS]
            if more:
                self._send(part, more)
            else:
                self._send(part)


class CompletionReplies:
    """What one completion sends: ``emit`` takes the model's text (read back
    through ``reader`` when the model's format has one), ``finish`` and
    ``fail`` end it."""

    def __init__(
        self,
        rid: int,
        send: Send,
        interval: float,
        reader: OutputStream | None,
        ended: Callable[[], None],
        memory: Callable[[], dict[str, dict[str, int]] | None] = lambda: None,
        with_context: bool = True,
    ) -> None:
        """``memory``: the runner's allocations where they changed since it
        last said, else None (``RunnerService.allocations_now``).
        ``with_context``: the exchange's tokens go in ``done`` (``Complete``)."""
        self.rid, self._send, self.reader, self._ended = rid, send, reader, ended
        self._memory = memory
        self._with_context = with_context
        self.logprobs: list[dict[str, Any]] = []  # not sent yet: they go with the next text
        self.out = TokenStream(self.send_tokens, interval)
        self.calls = 0
        self.thinking_tokens = 0  # tokens whose text the reader read as thinking

    def add_logprob(self, entry: dict[str, Any]) -> None:
        """A token's logprobs; sent on their own once ``LOGPROBS_HELD`` wait."""
        self.logprobs.append(entry)
        if len(self.logprobs) >= LOGPROBS_HELD:
            self.out.flush()  # with the text waiting for the interval, if any
            if self.logprobs:  # text a reader holds back comes later
                self.send_tokens("")

    def send_tokens(self, text: str, thinking: str = "") -> None:
        token = Token(text, thinking, self.logprobs[:])
        self.logprobs.clear()
        self._send({"id": self.rid, "type": "token", **compact(token)})

    def deliver(self, delta: OutputDelta) -> None:
        if delta.content or delta.thinking:
            self.out.add(delta.content, delta.thinking)
        if delta.tool_calls:
            self.out.flush()  # the text before the calls goes first
            self.calls += len(delta.tool_calls)
            calls = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in delta.tool_calls
            ]
            self._send({"id": self.rid, "type": "tool_calls", **fields_of(ToolCallsReply(calls))})

    def emit(self, text: str) -> None:
        if self.reader is None:
            self.out.add(text)
        else:
            delta = read_output(self.reader.feed, text)
            self.thinking_tokens += bool(delta.thinking)  # ``text`` is one token's, as a rule
            self.deliver(delta)

    def finish(self, result: Done) -> None:
        if (reader := self.reader) is not None:
            # at the token limit a call not closed is dropped, not sent as content
            cut_off = result.done_reason == "length"
            self.deliver(read_output(lambda: reader.finish(cut_off)))
        self.out.flush()
        if self.logprobs:  # tokens whose text never went out (a stop string)
            self.send_tokens("")
        self._ended()
        counts = {"tool_calls_count": self.calls, "thinking_tokens": self.thinking_tokens}
        if not self._with_context:
            result = replace(result, context=[])
        done = fields_of(replace(result, **counts, allocations=self._memory()))
        self._send({"id": self.rid, **done, "type": "done"})

    def fail(self, error: Exception) -> None:
        with contextlib.suppress(Exception):  # the text before, unless it is what failed
            self.out.flush()
        self._ended()
        self._send({"id": self.rid, **error_reply("complete", error)})


class UnreadableOutput(EngineError):
    """The model's output could not be read as its chat format says: that
    request ends with this error; the runner and the other requests go on."""


def read_output(read: Callable[..., OutputDelta], *text: str) -> OutputDelta:
    """A reader's next delta; any failure in it is ``UnreadableOutput``. The
    readers turn what they cannot parse into content, so this is for a bug,
    not for a model: it names what failed rather than killing the runner."""
    try:
        return read(*text)
    except Exception as e:
        trace = "".join(traceback.format_exception(e))
        print(f"runner: a reader failed on the model's output: {trace}", file=sys.stderr)
        raise UnreadableOutput(
            f"the model's output could not be read ({type(e).__name__}: {e})"
        ) from None


def error_reply(op: Any, e: Exception) -> dict[str, Any]:
    """The protocol's error message for ``e``: typed where the server acts on it."""
    if isinstance(e, InputError):
        return error_message(Error(str(e), INVALID))
    if isinstance(e, AllocationError):
        return error_message(Error(str(e), ALLOCATION))
    if not isinstance(e, UnreadableOutput):  # its reader's failure is logged already
        trace = "".join(traceback.format_exception(e))
        print(f"runner error in {op}: {trace}", file=sys.stderr)
    # whatever the text, it goes out: a lone surrogate would fail the reply's encoding
    text = (str(e) or type(e).__name__).encode("utf-8", "backslashreplace").decode()
    return error_message(Error(text))


def error_message(error: Error) -> dict[str, Any]:
    return {"type": "error", **compact(error)}
