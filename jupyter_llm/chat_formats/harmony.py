"""gpt-oss's "harmony" output, read as a stream of messages.

After the prompt's ``<|start|>assistant`` the model writes one or more
messages, each a header and a body::

    <|channel|>analysis<|message|>thinking...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{..}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer

The recipient (``to=...``) may also sit before the channel, in the role
part of the header. The last body may end with the text itself (the
runner stops at ``<|return|>`` / ``<|call|>`` without showing them). Text
before any header is a body without one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from jupyter_llm.chat_formats.markers import MAX_HELD_BLANKS, held_back

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_BODY_STOPS = (*ENDS, START, CHANNEL)
_RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")
# A header is held until its ``<|message|>``; one the model never closes is
# text past this many characters (a real header is a few dozen), so a prompt
# injection cannot make the reader hold the whole output until the end.
MAX_HEADER_CHARS = 1024


@dataclass(frozen=True)
class Header:
    """A message's header: its channel (``analysis``, ``commentary``,
    ``final``; empty for text outside any message), its recipient
    (``functions.get_weather``; empty for the user) and its content type
    (``json``)."""

    channel: str = ""
    recipient: str = ""
    constrain: str = ""


@dataclass(frozen=True)
class Event:
    """``cut``: the end of a message the token limit ended (``finish``)."""

    kind: Literal["header", "text", "end", "cut"]
    header: Header
    text: str = ""


def parse_header(text: str) -> Header:
    recipient = ""
    for found in _RECIPIENT.findall(text):
        if found != "assistant":
            recipient = found
    channel = ""
    if CHANNEL in text:
        channel = text.rsplit(CHANNEL, 1)[1].split(CONSTRAIN)[0]
        channel = _RECIPIENT.sub("", channel).strip().split(" ")[0] if channel.strip() else ""
    constrain = ""
    if CONSTRAIN in text:
        constrain = text.rsplit(CONSTRAIN, 1)[1].strip().split(" ")[0]
    elif channel == "commentary" and " json" in text.rsplit(CHANNEL, 1)[-1]:
        constrain = "json"
    return Header(channel=channel, recipient=recipient, constrain=constrain)


class HarmonyReader:
    """Feed text pieces, get header / text / end events. A piece of text that
    may be the start of a harmony token is held back until it is decided."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state: Literal["between", "header", "body"] = "between"
        self._header = Header()
        self._searched = 0  # in a header: where ``MESSAGE`` may still start

    def feed(self, text: str) -> list[Event]:
        blank = not self._buffer or self._buffer[-1].isspace()  # "between": all of it is
        self._buffer += text
        events: list[Event] = []
        if self._state == "between" and blank and text.isspace():
            if len(self._buffer) <= MAX_HELD_BLANKS:
                return []  # still undecided: not stripped again (quadratic in blanks)
            # so many blanks are text in no message (each held piece copied them all)
            self._header, self._state = Header(), "body"
            events.append(Event("header", self._header))
        while self._step(events, final=False):
            pass
        return events

    def finish(self, cut_off: bool = False) -> list[Event]:
        """The events held back. ``cut_off``: the output ended at the token
        limit: the last message ends in "cut", not "end" (a call in it is one
        only if its arguments are whole), and a harmony token's beginning at
        the very end is dropped."""
        events: list[Event] = []
        if cut_off and self._state == "between":
            head = self._buffer.lstrip()
            if head and any(m.startswith(head) for m in (START, CHANNEL, "to=")):
                self._buffer = ""
        while self._step(events, final=True):
            pass
        if self._state == "header":
            self._buffer = ""  # a header the model never finished says nothing
        elif self._state == "body":
            if self._buffer:
                events.append(Event("text", self._header, self._buffer))
            events.append(Event("cut" if cut_off else "end", self._header))
        self._buffer, self._state, self._searched = "", "between", 0
        return events

    def _step(self, events: list[Event], final: bool) -> bool:
        """Advance once; False when more text is needed."""
        buf = self._buffer
        if self._state == "between":
            if not buf:
                return False
            head = buf.lstrip()
            if head.startswith(START):
                self._buffer, self._state = head[len(START) :], "header"
                return True
            if head.startswith((CHANNEL, "to=")):
                self._state = "header"
                return True
            if not final and (not head or any(m.startswith(head) for m in (START, CHANNEL, "to="))):
                return False
            self._header = Header()
            self._state = "body"
            events.append(Event("header", self._header))
            return True
        if self._state == "header":
            at = buf.find(MESSAGE, self._searched)
            if at < 0 and len(buf) > MAX_HEADER_CHARS:  # never a header: text, in no message
                self._searched, self._header, self._state = 0, Header(), "body"
                # up to the first marker past its start (at least one character, so a
                # buffer that opens with one moves on), or as a body holds it back
                stop = min((i for m in _BODY_STOPS if (i := buf.find(m, 1)) > 0), default=0)
                cut = stop or max(1, len(buf) - held_back(buf, _BODY_STOPS))
                events += [Event("header", self._header), Event("text", self._header, buf[:cut])]
                self._buffer = buf[cut:]
                return True
            if at < 0:  # next time, only what is new (and a marker across the join)
                self._searched = max(0, len(buf) - len(MESSAGE) + 1)
                return False
            self._searched = 0
            self._header = parse_header(buf[:at])
            self._buffer, self._state = buf[at + len(MESSAGE) :], "body"
            events.append(Event("header", self._header))
            return True
        # body
        stop = min(((buf.find(m), m) for m in _BODY_STOPS if m in buf), default=None)
        if stop is None:
            keep = 0 if final else held_back(buf, _BODY_STOPS)
            if len(buf) > keep:
                events.append(Event("text", self._header, buf[: len(buf) - keep]))
                self._buffer = buf[len(buf) - keep :]
            return False
        at, marker = stop
        if at:
            events.append(Event("text", self._header, buf[:at]))
        events.append(Event("end", self._header))
        self._buffer = buf[at + len(marker) :] if marker in ENDS else buf[at:]
        self._state = "between"
        return True


def serialize_header(header: Header) -> str:
    """A header as harmony text, for a layer that passes a message on."""
    text = f"{CHANNEL}{header.channel or 'commentary'}"
    if header.recipient:
        text += f" to={header.recipient}"
    if header.constrain:
        text += f" {CONSTRAIN}{header.constrain}"
    return text + MESSAGE
