"""An embed request's replies: its vectors as ``embedding`` messages of at most
``part_bytes`` of JSON each, then one ``result`` with the counts, or an ``error``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jupyter_llm.runner.completion import error_message, error_reply
from jupyter_llm.runner.protocol import Error

Send = Callable[[dict[str, Any]], None]


class EmbedReplies:
    """``emit`` takes vectors (each the JSON text the response holds for it);
    ``finish`` and ``fail`` end the request. ``cancelled`` and ``ended`` are
    the service's record of cancelled requests."""

    def __init__(
        self,
        rid: int,
        send: Send,
        part_bytes: int,
        count: int,
        cancelled: Callable[[], bool],
        ended: Callable[[], None],
        memory: Callable[[], dict[str, dict[str, int]] | None] = lambda: None,
    ) -> None:
        self.rid, self._send, self.part_bytes, self.count = rid, send, part_bytes, count
        self._cancelled, self._ended = cancelled, ended
        self._memory = memory  # as ``CompletionReplies``'s
        self.part: list[str] = []
        self.size = 0

    def flush(self) -> None:
        if self.part:
            self._send({"id": self.rid, "type": "embedding", "vectors": self.part[:]})
            self.part.clear()
            self.size = 0

    def emit(self, vectors: list[str]) -> None:
        for vector in vectors:
            if self.part and self.size + len(vector) > self.part_bytes:
                self.flush()
            self.part.append(vector)
            self.size += len(vector) + 3

    def finish(self, prompt_eval_count: int) -> None:
        self.flush()
        self._ended()
        result = {"prompt_eval_count": prompt_eval_count, "count": self.count}
        if (allocations := self._memory()) is not None:  # its context was made: more held
            result["allocations"] = allocations
        self._send({"id": self.rid, "type": "result", **result})

    def fail(self, error: Exception) -> None:
        if self._cancelled():  # nobody waits for it: no traceback either
            reply = error_message(Error("cancelled"))
        else:
            reply = error_reply("embed", error)
        self._ended()
        self._send({"id": self.rid, **reply})
