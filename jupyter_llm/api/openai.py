"""OpenAI-compatible handlers under ``{base_url}llm/v1/``: chat completions,
completions, embeddings and models, streaming as server-sent events.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
which the ``openai`` client turns into its exceptions: ``OpenAIHandler``
only overrides ``error_body`` (the base's one ``write_error`` and its stream
use it). Sampling fields are checked against the one option table
(``jupyter_llm.options.OPENAI_FIELDS``, formerly ``sampling_from`` here) and
messages by ``jupyter_llm.messages`` (formerly ``chat_messages`` here).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from tornado import web

from jupyter_llm.api.base import LLM, SSE, LLMHandler, authorized
from jupyter_llm.api.generation import (
    Finished,
    Job,
    Logprobs,
    Thinking,
    ToolCalls,
    complete,
    embed,
    json_array,
    write_json_pieces,
)
from jupyter_llm.api.requests import (
    logprobs_field,
    messages_field,
    openai_options_field,
    parse_embed_input,
    reasoning_field,
    tool_choice_field,
    tools_field,
)
from jupyter_llm.api.structured import invalid_format, parse_format
from jupyter_llm.errors import InvalidRequest
from jupyter_llm.models.names import parse_model_name

FINISH = {"stop": "stop", "length": "length", "cancel": "stop"}
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "server_busy"}


class OpenAIHandler(LLMHandler):
    def error_body(self, status: int, message: str) -> Any:
        return openai_error(status, message)

    async def _stream_sse(
        self,
        job: Job,
        chunk: Callable[[str | None, str | None], dict[str, Any]],
        usage_chunk: Callable[[Finished], dict[str, Any]] | None,
        other: Callable[[Thinking | ToolCalls | Logprobs], dict[str, Any]] | None = None,
    ) -> None:
        """Server-sent events: one ``data:`` per piece of text (``other``
        turns thinking and tool calls into chunks), the finish reason,
        optional usage, then ``data: [DONE]``."""

        async def events() -> AsyncGenerator[list[dict[str, Any]], None]:
            called = False
            async with aclosing(complete(self.llm, job, self.requester)) as batches:
                async for batch in batches:
                    out = []
                    for event in batch:
                        if isinstance(event, str):
                            out.append(chunk(event, None))
                        elif isinstance(event, Finished):
                            out.append(chunk(None, finish_reason(event, called)))
                            if usage_chunk is not None:
                                out.append(usage_chunk(event))
                        else:
                            called = called or isinstance(event, ToolCalls)
                            if other is not None:
                                out.append(other(event))
                    yield out

        await self.stream(events(), SSE)


def openai_error(status: int, message: str) -> dict[str, Any]:
    return {
        "message": message,
        "type": ERROR_TYPES.get(status, "api_error"),
        "param": None,
        "code": None,
    }


def parallel_field(body: dict[str, Any]) -> bool | None:
    value = body.get("parallel_tool_calls")
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest("parallel_tool_calls must be a boolean")
    return value


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


def finish_reason(f: Finished, called: bool) -> str:
    return "tool_calls" if called else FINISH.get(f.done_reason, "stop")


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


def usage(f: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": f.prompt_eval_count,
        "completion_tokens": f.eval_count,
        "total_tokens": f.prompt_eval_count + f.eval_count,
    }


def stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean")
    return stream


def include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object")
    return bool(options.get("include_usage", False))


def response_format(body: dict[str, Any]) -> Any:
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


def chat_job(body: dict[str, Any]) -> Job:
    """A chat completion request as the job ``complete`` runs."""
    tools = tools_field(body.get("tools"))
    return Job(
        model=parse_model_name(body.get("model")),
        options=openai_options_field(body),
        messages=messages_field(body.get("messages"), openai=True),
        tools=tools,
        tool_choice=tool_choice_field(body.get("tool_choice"), tools),
        parallel_tool_calls=parallel_field(body),
        logprobs=logprobs_field(body.get("logprobs"), body.get("top_logprobs")),
        think=reasoning_field(body),
        format=response_format(body),
    )


class ChatCompletionsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        # images, tool schemas and the grammar are CPU work: off the event loop
        job = await self.blocking(chat_job, body)
        model = job.model
        stream, with_usage = stream_flag(body), include_usage(body)
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        base = {
            "id": ident,
            "created": created,
            "model": model.display,
            "system_fingerprint": "fp_jupyter_llm",
        }
        if not stream:
            if (reply := await self.whole_completion(job)) is None:
                return  # the client left
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if reply.thinking:
                message["reasoning"] = reply.thinking
            if reply.tool_calls:
                message["tool_calls"] = [
                    {k: v for k, v in call.items() if k != "index"}
                    for call in openai_tool_calls(reply.tool_calls, 0)
                ]
                message["content"] = reply.text or None
            choice_logprobs = {"content": reply.logprobs} if job.logprobs is not None else None
            self.write_json(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "logprobs": choice_logprobs,
                            "finish_reason": finish_reason(reply.finished, bool(reply.tool_calls)),
                        }
                    ],
                    "usage": usage(reply.finished),
                }
            )
            return
        first = [True]
        count = [0]

        def chunk(text: str | None, finish: str | None) -> dict[str, Any]:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first[0]:
                delta["role"] = "assistant"
                first[0] = False
            return {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def usage_chunk(f: Finished) -> dict[str, Any]:
            return {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage(f)}

        def other(event: Thinking | ToolCalls | Logprobs) -> dict[str, Any]:
            out = chunk(None, None)
            delta = out["choices"][0]["delta"]
            if isinstance(event, Logprobs):
                out["choices"][0]["logprobs"] = {"content": event.entries}
            elif isinstance(event, Thinking):
                delta["reasoning"] = event.text
            else:
                delta["tool_calls"] = openai_tool_calls(event.calls, count[0])
                count[0] += len(event.calls)
            return out

        await self._stream_sse(job, chunk, usage_chunk if with_usage else None, other)


class CompletionsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        model = parse_model_name(body.get("model"))
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string (or a list of one string)")
        suffix = body.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidRequest("suffix must be a string")
        logprobs = body.get("logprobs")
        if logprobs is not None and (
            isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5
        ):
            raise InvalidRequest("logprobs must be an integer between 0 and 5")
        job = Job(
            model=model,
            options=openai_options_field(body),
            prompt=prompt,
            suffix=suffix,
            logprobs=logprobs,
        )
        stream, with_usage = stream_flag(body), include_usage(body)
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        base = {
            "id": ident,
            "created": created,
            "model": model.display,
            "system_fingerprint": "fp_jupyter_llm",
            "object": "text_completion",
        }
        if not stream:
            if (reply := await self.whole_completion(job)) is None:
                return  # the client left
            text, finished = reply.text, reply.finished
            legacy = legacy_logprobs(reply.logprobs, 0) if logprobs is not None else None
            self.write_json(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "text": text,
                            "logprobs": legacy,
                            "finish_reason": FINISH.get(finished.done_reason, "stop"),
                        }
                    ],
                    "usage": usage(finished),
                }
            )
            return

        def chunk(text: str | None, finish: str | None) -> dict[str, Any]:
            return {
                **base,
                "choices": [
                    {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
                ],
            }

        def usage_chunk(f: Finished) -> dict[str, Any]:
            return {**base, "choices": [], "usage": usage(f)}

        offset = [0]

        def other(event: Thinking | ToolCalls | Logprobs) -> dict[str, Any]:
            out = chunk("", None)
            if isinstance(event, Logprobs):
                out["choices"][0]["logprobs"] = legacy_logprobs(event.entries, offset[0])
                offset[0] += sum(len(e["token"]) for e in event.entries)
            return out

        await self._stream_sse(job, chunk, usage_chunk if with_usage else None, other)


class EmbeddingsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        model = parse_model_name(body.get("model"))
        inputs = parse_embed_input(body.get("input"), "input")
        if not inputs:
            raise InvalidRequest("input must not be empty")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InvalidRequest('encoding_format must be "float" or "base64"')
        dimensions = body.get("dimensions")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise InvalidRequest("dimensions must be a positive integer")
        result = await embed(
            self.llm,
            model,
            inputs,
            dimensions=dimensions,
            encoding=encoding,  # the runner writes base64 itself
            requester=self.requester,
        )
        data = (  # each vector as the runner wrote it, never decoded here
            f'{{"object":"embedding","index":{i},"embedding":{vector}}}'
            for i, vector in enumerate(result.vectors)
        )
        await write_json_pieces(
            self,
            {
                "object": "list",
                "data": json_array(data),
                "model": model.display,
                "usage": {
                    "prompt_tokens": result.prompt_eval_count,
                    "total_tokens": result.prompt_eval_count,
                },
            },
        )


def model_object(entry: Any) -> dict[str, Any]:
    return {
        "id": entry.name.display,
        "object": "model",
        "created": int(entry.modified_at.timestamp()),
        "owned_by": entry.name.namespace,
    }


class ModelsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        entries = await self.blocking(self.llm.store.list)
        self.write_json({"object": "list", "data": [model_object(e) for e in entries]})

    head = get  # a probe: the same status and headers, no body


class ModelHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self, model: str) -> None:
        entry = await self.blocking(self.llm.store.get, parse_model_name(model))
        self.write_json(model_object(entry))

    head = get


def handlers() -> list[tuple[str, type[LLMHandler]]]:
    """Routes relative to ``{base_url}llm/``."""
    return [
        (r"v1/chat/completions", ChatCompletionsHandler),
        (r"v1/completions", CompletionsHandler),
        (r"v1/embeddings", EmbeddingsHandler),
        (r"v1/models", ModelsHandler),
        (r"v1/models/(?P<model>.+)", ModelHandler),
    ]
