"""A generation as OpenAI's Responses API writes it: the ``response``
object, and a stream's typed events.

The stream is ``response.created`` and ``response.in_progress``, then per
output item ``response.output_item.added``, its deltas (reasoning text,
``content_part.added`` and ``output_text.delta``, or
``function_call_arguments.delta``), their ``.done`` events and
``response.output_item.done``, and last ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` cut it) with the whole
response: every event numbered by ``sequence_number``, as the ``openai``
client's ``responses.stream`` reads them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.api.generation import Event, Finished, Reply, route_events


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(f: Finished) -> dict[str, Any]:
    return {
        "input_tokens": f.prompt_eval_count,
        "input_tokens_details": {"cached_tokens": f.prompt_cached},
        "output_tokens": f.eval_count,
        "output_tokens_details": {"reasoning_tokens": f.thinking_tokens},
        "total_tokens": f.prompt_eval_count + f.eval_count,
    }


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id or new_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [text_part(text)] if status == "completed" else [],
    }


def call_item(call: dict[str, Any], arguments: str | None = None) -> dict[str, Any]:
    """A finished tool call as a ``function_call`` item (arguments as JSON text)."""
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call.get("id") or new_id("call"),
        "name": call["name"],
        "arguments": json.dumps(call.get("arguments", {})) if arguments is None else arguments,
        "status": "completed",
    }


@dataclass
class Head:
    """What every response object of one answer shares: its id, time, model
    and the request's settings as it echoes them."""

    model: str
    echo: dict[str, Any]
    previous_response_id: str | None = None
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, output: list[dict[str, Any]], f: Finished | None) -> dict[str, Any]:
        """The ``response`` object: in progress until ``f`` finishes it."""
        status, incomplete = "in_progress", None
        if f is not None:
            status = "incomplete" if f.done_reason == "length" else "completed"
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            **self.echo,
            "previous_response_id": self.previous_response_id,
            "truncation": "disabled",
            "usage": usage(f) if f is not None else None,
            "incomplete_details": incomplete,
            "error": None,
            "user": None,
        }


def whole_output(reply: Reply) -> list[dict[str, Any]]:
    """The output items of a whole answer: reasoning, the message, the calls."""
    output = []
    if reply.thinking:
        output.append(reasoning_item(reply.thinking))
    if reply.text or not reply.tool_calls:
        output.append(message_item(reply.text))
    output.extend(call_item(call) for call in reply.tool_calls)
    return output


def stored_turn(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The response's output as the assistant message a later request continues from."""
    turn: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        if item["type"] == "reasoning":
            turn["reasoning"] = item["content"][0]["text"]
        elif item["type"] == "message":
            turn["content"] = "".join(p["text"] for p in item["content"])
        else:
            function = {"name": item["name"], "arguments": item["arguments"]}
            call = {"id": item["call_id"], "type": "function", "function": function}
            turn.setdefault("tool_calls", []).append(call)
    return turn


@dataclass
class ResponseEvents:
    """A stream's events as the Responses API's typed events."""

    head: Head
    output: list[dict[str, Any]] = field(default_factory=list)  # items done
    open: dict[str, Any] | None = None  # the reasoning or message item being written
    text: str = ""  # the open item's text so far
    sequence: int = 0
    out: list[dict[str, Any]] = field(default_factory=list)
    finished: Finished | None = None

    def emit(self, kind: str, **fields: Any) -> None:
        self.out.append({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1

    def batch(self, events: list[Event]) -> list[dict[str, Any]]:
        if self.sequence == 0:
            self.emit("response.created", response=self.head.response([], None))
            self.emit("response.in_progress", response=self.head.response([], None))
        route_events(
            events,
            lambda text: self.delta("message", text),
            lambda text: self.delta("reasoning", text),
            self.tool_call,
            self.finish,
        )
        out, self.out = self.out, []
        return out

    def where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def open_item(self, kind: str) -> None:
        self.close_item()
        item = message_item("", status="in_progress") if kind == "message" else None
        if item is None:
            item = {**reasoning_item(""), "content": [], "status": "in_progress"}
        self.open, self.text = item, ""
        self.emit("response.output_item.added", output_index=len(self.output), item=item)
        if kind == "message":
            self.emit(
                "response.content_part.added", **self.where(), content_index=0, part=text_part("")
            )

    def delta(self, kind: str, text: str) -> None:
        if self.open is None or self.open["type"] != kind:
            self.open_item(kind)
        self.text += text
        if kind == "message":
            self.emit(
                "response.output_text.delta",
                **self.where(),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        else:
            self.emit("response.reasoning_text.delta", **self.where(), content_index=0, delta=text)

    def close_item(self) -> None:
        if self.open is None:
            return
        at = self.where()
        if self.open["type"] == "message":
            item = message_item(self.text, self.open["id"])
            self.emit(
                "response.output_text.done", **at, content_index=0, text=self.text, logprobs=[]
            )
            self.emit(
                "response.content_part.done", **at, content_index=0, part=text_part(self.text)
            )
        else:
            item = reasoning_item(self.text, self.open["id"])
            self.emit("response.reasoning_text.done", **at, content_index=0, text=self.text)
        self.emit("response.output_item.done", output_index=at["output_index"], item=item)
        self.output.append(item)
        self.open = None

    def tool_call(self, call: dict[str, Any]) -> None:
        self.close_item()
        item = call_item(call)
        at = {"item_id": item["id"], "output_index": len(self.output)}
        self.emit(
            "response.output_item.added",
            output_index=at["output_index"],
            item={**item, "arguments": "", "status": "in_progress"},
        )
        self.emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
        self.emit(
            "response.function_call_arguments.done",
            **at,
            name=item["name"],
            arguments=item["arguments"],
        )
        self.emit("response.output_item.done", output_index=at["output_index"], item=item)
        self.output.append(item)

    def finish(self, f: Finished) -> None:
        if not self.output and self.open is None:
            self.open_item("message")  # an empty answer is still one message
        self.close_item()
        self.finished = f
        response = self.head.response(self.output, f)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        self.emit(kind, response=response)
