"""OpenAI's wire shapes, translated to and from the one generation request.

Pure functions over parsed JSON, as Ollama's ``openai/openai.go`` translates
around its native types: a ``/v1/chat/completions`` or ``/v1/completions``
body becomes an ``OpenAICall`` (a ``GenerationRequest`` and how the client
wants its answer), and a finished generation, or its stream of events,
becomes OpenAI's objects and chunks. The handlers in ``api/openai.py`` parse,
call and write.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from jupyter_llm.api.base import json_array
from jupyter_llm.api.generation import (
    Embedded,
    Event,
    Finished,
    GenerationRequest,
    Logprobs,
    Reply,
    Thinking,
    ToolCalls,
    paired,
)
from jupyter_llm.api.requests import (
    EmbedRequest,
    legacy_logprobs_field,
    logprobs_field,
    messages_field,
    openai_options_field,
    parse_embed_input,
    priority_field,
    reasoning_field,
    tool_choice_field,
    tools_field,
    typed_field,
)
from jupyter_llm.api.structured import invalid_format, parse_format
from jupyter_llm.grammar.check import OutputFormat
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.request.errors import InvalidRequest

FINISH = {"stop": "stop", "length": "length", "cancel": "stop"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",  # OpenAI's, with the code "invalid_api_key"
    404: "not_found_error",
    503: "server_busy",
}
FINGERPRINT = "fp_jupyter_llm"


def openai_error(status: int, message: str) -> dict[str, Any]:
    """The value of ``"error"`` in OpenAI's error responses."""
    return {
        "message": message,
        "type": ERROR_TYPES.get(status, "api_error"),
        "param": None,
        "code": "invalid_api_key" if status == 401 else None,
    }


# -- bodies -> a generation request --------------------------------------------------


@dataclass
class OpenAICall:
    """A ``/v1/chat/completions`` or ``/v1/completions`` body: the generation
    it asks for, and how it wants the answer."""

    generation: GenerationRequest
    stream: bool = False
    include_usage: bool = False  # a stream's last chunk reports the usage


def parallel_field(body: dict[str, Any]) -> bool | None:
    return typed_field(body, "parallel_tool_calls", bool, "a boolean")


def stream_flag(body: dict[str, Any]) -> bool:
    return bool(typed_field(body, "stream", bool, "a boolean", False))


def include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object")
    return bool(options.get("include_usage", False))


def response_format(body: dict[str, Any]) -> OutputFormat | None:
    """``response_format``: text (none), any JSON object, or a JSON Schema."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequest(
            'response_format must be {"type": "text" | "json_object" | "json_schema"}'
        )
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return parse_format("json")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise invalid_format(spec)
    return parse_format(spec["schema"], "response_format.json_schema.schema")


def chat_call(body: dict[str, Any]) -> OpenAICall:
    """A chat completion body. Images are decoded, tool schemas checked and
    the grammar converted: call this off the event loop."""
    tools = tools_field(body.get("tools"))
    request = GenerationRequest(
        model=parse_model_name(body.get("model")),
        options=openai_options_field(body),
        messages=messages_field(body.get("messages"), openai=True),
        tools=tools,
        tool_choice=tool_choice_field(body.get("tool_choice"), tools),
        parallel_tool_calls=parallel_field(body),
        logprobs=logprobs_field(body.get("logprobs"), body.get("top_logprobs")),
        think=reasoning_field(body),
        format=response_format(body),
        priority=priority_field(body),
    )
    return OpenAICall(request, stream_flag(body), include_usage(body))


def completion_call(body: dict[str, Any]) -> OpenAICall:
    """A (legacy) completion body: a prompt (a string, or a list of one) and
    perhaps a ``suffix`` to fill in."""
    model = parse_model_name(body.get("model"))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string (or a list of one string)")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise InvalidRequest("suffix must be a string")
    request = GenerationRequest(
        model=model,
        logprobs=legacy_logprobs_field(body.get("logprobs")),
        options=openai_options_field(body),
        prompt=prompt,
        suffix=suffix,
        priority=priority_field(body),
        route="generate",
    )
    return OpenAICall(request, stream_flag(body), include_usage(body))


def embeddings_call(body: dict[str, Any]) -> EmbedRequest:
    """A ``/v1/embeddings`` body."""
    model = parse_model_name(body.get("model"))
    inputs = parse_embed_input(body.get("input"), "input")
    if not inputs:
        raise InvalidRequest("input must not be empty")
    encoding = body.get("encoding_format") or "float"  # null: the default, as the client types it
    encoding = encoding.lower() if isinstance(encoding, str) else encoding  # Ollama: any case
    if encoding not in ("float", "base64"):
        raise InvalidRequest('encoding_format must be "float" or "base64"')
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise InvalidRequest("dimensions must be a positive integer")
    return EmbedRequest(model, inputs, dimensions=dimensions, encoding=encoding)


# -- a generation -> OpenAI's objects --------------------------------------------------


def header(prefix: str, model: str) -> dict[str, Any]:
    """The fields every object of one answer starts with: a new id, now."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
    }


def finish_reason(f: Finished, called: bool) -> str:
    return "tool_calls" if called else FINISH.get(f.done_reason, "stop")


def usage(f: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": f.prompt_eval_count,
        "completion_tokens": f.eval_count,
        "total_tokens": f.prompt_eval_count + f.eval_count,
        "prompt_tokens_details": {"cached_tokens": f.prompt_cached},
    }


def openai_tool_calls(calls: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """OpenAI's ``tool_calls``: arguments as JSON text, an index when streamed."""
    return [
        {
            "index": first + i,
            "id": call.get("id") or f"call_{uuid.uuid4().hex[:8]}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": json.dumps(call.get("arguments", {})),
            },
        }
        for i, call in enumerate(calls)
    ]


def legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """``/v1/completions``' older logprobs shape, text offsets from ``offset``."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def chat_completion(head: dict[str, Any], reply: Reply, logprobs: bool) -> dict[str, Any]:
    """A ``chat.completion``: the whole answer."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.thinking:
        message["reasoning"] = reply.thinking
    if reply.tool_calls:
        message["tool_calls"] = [
            {k: v for k, v in call.items() if k != "index"}
            for call in openai_tool_calls(reply.tool_calls, 0)
        ]
        message["content"] = reply.text or None
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": reply.logprobs} if logprobs else None,
        "finish_reason": finish_reason(reply.finished, bool(reply.tool_calls)),
    }
    return {
        **head,
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage(reply.finished),
    }


def text_completion(head: dict[str, Any], reply: Reply, logprobs: bool) -> dict[str, Any]:
    """A ``text_completion``: the whole answer."""
    choice = {
        "index": 0,
        "text": reply.text,
        "logprobs": legacy_logprobs(reply.logprobs, 0) if logprobs else None,
        "finish_reason": FINISH.get(reply.finished.done_reason, "stop"),
    }
    return {
        **head,
        "object": "text_completion",
        "choices": [choice],
        "usage": usage(reply.finished),
    }


@dataclass
class ChunkEncoder:
    """A stream's events as OpenAI's chunks: one per piece of text, the
    finish reason (``tool_calls`` once a call came), then the usage if asked
    for. Subclasses shape the chunks and keep what a stream must remember."""

    head: dict[str, Any]
    include_usage: bool = False
    called: bool = False  # a tool call was streamed

    def text(self, text: str | None, finish: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def other(self, event: Thinking | ToolCalls) -> dict[str, Any]:
        raise NotImplementedError

    def with_logprobs(self, chunk: dict[str, Any], event: Logprobs) -> dict[str, Any]:
        """``chunk`` carrying ``event``'s log-probabilities (those of its text)."""
        raise NotImplementedError

    def usage_chunk(self, f: Finished) -> dict[str, Any]:
        raise NotImplementedError

    def batch(self, events: list[Event]) -> list[dict[str, Any]]:
        out = []
        for event, logprobs in paired(events):
            if isinstance(event, str):
                chunk = self.text(event, None)
                out.append(chunk if logprobs is None else self.with_logprobs(chunk, logprobs))
            elif isinstance(event, Logprobs):  # no text after them: a chunk of their own
                out.append(self.with_logprobs(self.text(None, None), event))
            elif isinstance(event, Finished):
                out.append(self.text(None, finish_reason(event, self.called)))
                if self.include_usage:
                    out.append(self.usage_chunk(event))
            else:
                self.called = self.called or isinstance(event, ToolCalls)
                out.append(self.other(event))
        return out


@dataclass
class ChatChunks(ChunkEncoder):
    """``chat.completion.chunk``s: the first delta names the role; tool
    calls are numbered across the stream."""

    first: bool = True
    calls_sent: int = 0

    def text(self, text: str | None, finish: str | None) -> dict[str, Any]:
        delta: dict[str, Any] = {} if text is None else {"content": text}
        if self.first:
            delta["role"] = "assistant"
            self.first = False
        return {
            **self.head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def other(self, event: Thinking | ToolCalls) -> dict[str, Any]:
        out = self.text(None, None)
        choice = out["choices"][0]
        if isinstance(event, Thinking):
            choice["delta"]["reasoning"] = event.text
        else:
            choice["delta"]["tool_calls"] = openai_tool_calls(event.calls, self.calls_sent)
            self.calls_sent += len(event.calls)
        return out

    def with_logprobs(self, chunk: dict[str, Any], event: Logprobs) -> dict[str, Any]:
        chunk["choices"][0]["logprobs"] = {"content": event.entries}
        return chunk

    def usage_chunk(self, f: Finished) -> dict[str, Any]:
        return {**self.head, "object": "chat.completion.chunk", "choices": [], "usage": usage(f)}


@dataclass
class CompletionChunks(ChunkEncoder):
    """``text_completion`` chunks; logprobs' text offsets run across the stream."""

    offset: int = 0  # characters of text the logprobs covered so far

    def text(self, text: str | None, finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self.head, "object": "text_completion", "choices": [choice]}

    def other(self, event: Thinking | ToolCalls) -> dict[str, Any]:
        return self.text("", None)

    def with_logprobs(self, chunk: dict[str, Any], event: Logprobs) -> dict[str, Any]:
        chunk["choices"][0]["logprobs"] = legacy_logprobs(event.entries, self.offset)
        self.offset += sum(len(e["token"]) for e in event.entries)
        return chunk

    def usage_chunk(self, f: Finished) -> dict[str, Any]:
        return {**self.head, "object": "text_completion", "choices": [], "usage": usage(f)}


def embeddings_body(model: str, result: Embedded) -> dict[str, Any]:
    """``/v1/embeddings``' answer around the vectors, each as the runner wrote it."""
    data = (
        f'{{"object":"embedding","index":{i},"embedding":{vector}}}'
        for i, vector in enumerate(result.vectors)
    )
    return {
        "object": "list",
        "data": json_array(data),
        "model": model,
        "usage": {
            "prompt_tokens": result.prompt_eval_count,
            "total_tokens": result.prompt_eval_count,
        },
    }


def model_object(entry: ModelEntry) -> dict[str, Any]:
    """A model as ``/v1/models`` lists it."""
    return {
        "id": entry.name.display,
        "object": "model",
        "created": int(entry.modified_at.timestamp()),
        "owned_by": entry.name.namespace,
    }
