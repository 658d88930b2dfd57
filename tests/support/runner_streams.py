"""Reading a runner process's reply stream in tests: the text it streamed
and its ``done`` message."""

from __future__ import annotations

from typing import Any


async def text_and_done(stream: Any) -> tuple[str, dict[str, Any]]:
    """The tokens' text joined, and the ``done`` message that ended them."""
    text = []
    async for batch in stream:
        for message in batch:
            if message["type"] == "token":
                text.append(message["text"])
            elif message["type"] == "done":
                return "".join(text), message
    raise AssertionError("no done message")
