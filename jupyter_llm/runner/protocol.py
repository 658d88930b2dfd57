"""The runner wire protocol: newline-delimited JSON over a private socketpair.

Requests:  {"id": int, "op": "info"|"load"|"complete"|"embed"|"tokenize"|"health"|"cancel"
            |"close", ...}
Replies:   {"id": int, "type": "result"|"token"|"done"|"embedding"|"progress"|"error", ...}

``complete`` streams ``token`` messages then one ``done``; ``embed`` streams
``embedding`` messages (``vectors``: a part of the vectors in order, each the
JSON text of one response element, each line at most the request's
``part_bytes``) then one ``result``; every other op answers with one
``result`` (or ``error``). ``cancel`` names the id of a running request.
"""

from __future__ import annotations

import json
from typing import Any

# The "kind" of an error reply, for failures the server acts on:
INVALID = "invalid"  # caused by the request itself (HTTP 400)
ALLOCATION = "allocation"  # llama.cpp could not allocate memory (the scheduler may retry)


class EngineError(Exception):
    """A failure the runner reports to the server as an ``error`` reply."""


class InputError(EngineError):
    """The request cannot be served as asked: the server answers 400."""


class AllocationError(EngineError):
    """llama.cpp reported a failed allocation while this request ran."""


ERROR_MARKERS = ("error", "failed to allocate", "out of memory", "ggml_assert", "exception")


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("runner message is not a JSON object")
    return message


def is_error_line(line: str) -> bool:
    """Does a runner stderr line look like the reason for a failure?"""
    lowered = line.lower()
    return any(marker in lowered for marker in ERROR_MARKERS)
