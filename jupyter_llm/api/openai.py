"""OpenAI-compatible handlers under ``{base_url}llm/v1/``: chat completions,
completions, embeddings and models, streaming as server-sent events.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
which the ``openai`` client turns into its exceptions.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_llm.api.base import LLMHandler
from jupyter_llm.api.generation import Finished, Job, complete, embed
from jupyter_llm.api.requests import ROLES, parse_embed_input
from jupyter_llm.api.structured import invalid_format, parse_format
from jupyter_llm.errors import InvalidRequest, LLMError
from jupyter_llm.models.names import parse_model_name

FINISH = {"stop": "stop", "length": "length", "cancel": "stop"}
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "server_busy"}


class OpenAIHandler(LLMHandler):
    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = str(exc) if isinstance(exc, LLMError) else None
        if message is None and isinstance(exc, web.HTTPError):
            message = exc.log_message or exc.reason
        message = message or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": openai_error(status_code, message)}))

    async def _stream_sse(
        self,
        job: Job,
        chunk: Callable[[str | None, str | None], dict[str, Any]],
        usage_chunk: Callable[[Finished], dict[str, Any]] | None,
    ) -> None:
        """Server-sent events: one ``data:`` per batch of text, the finish reason,
        optional usage, then ``data: [DONE]``."""
        begun = False
        events = complete(self.llm, job)
        try:
            async for batch in events:
                out = []
                for event in batch:
                    if isinstance(event, str):
                        out.append(chunk(event, None))
                    else:
                        out.append(chunk(None, FINISH.get(event.done_reason, "stop")))
                        if usage_chunk is not None:
                            out.append(usage_chunk(event))
                if self._client_gone:
                    return
                if not begun:
                    self.set_header("Content-Type", "text/event-stream")
                    self.set_header("Cache-Control", "no-cache")
                    begun = True
                self.write("".join(f"data: {json.dumps(c)}\n\n" for c in out))
                await self.flush()
        except StreamClosedError:
            return
        except LLMError as e:
            if not begun:
                raise
            self.write(f"data: {json.dumps({'error': openai_error(e.status, str(e))})}\n\n")
        finally:
            await events.aclose()
        self.write("data: [DONE]\n\n")
        self.finish()

    async def _collect(self, job: Job) -> tuple[str, Finished]:
        parts: list[str] = []
        events = complete(self.llm, job)
        try:
            async for batch in events:
                for event in batch:
                    if isinstance(event, str):
                        parts.append(event)
                    else:
                        return "".join(parts), event
        finally:
            await events.aclose()
        raise LLMError("the runner ended without finishing")


def openai_error(status: int, message: str) -> dict[str, Any]:
    return {
        "message": message,
        "type": ERROR_TYPES.get(status, "api_error"),
        "param": None,
        "code": None,
    }


def usage(f: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": f.prompt_eval_count,
        "completion_tokens": f.eval_count,
        "total_tokens": f.prompt_eval_count + f.eval_count,
    }


def sampling_from(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's sampling fields as Ollama options (type- and range-checked)."""
    options: dict[str, Any] = {}

    def number(key: str, low: float | None = None, high: float | None = None) -> Any:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(f"{key} must be a number")
        if (low is not None and value < low) or (high is not None and value > high):
            raise InvalidRequest(f"{key} must be between {low} and {high}, got {value}")
        return value

    for key, option, low, high in (
        ("temperature", "temperature", 0, 2),
        ("top_p", "top_p", 0, 1),
        ("frequency_penalty", "frequency_penalty", -2, 2),
        ("presence_penalty", "presence_penalty", -2, 2),
    ):
        if (value := number(key, low, high)) is not None:
            options[option] = value
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"{key} must be a positive integer")
            options["num_predict"] = value
            break
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidRequest("seed must be an integer")
        options["seed"] = seed
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequest("stop must be a string or a list of strings")
        options["stop"] = stop
    n = body.get("n", 1)
    if n != 1:
        raise InvalidRequest("n must be 1: one choice per request")
    if "temperature" not in options:
        options["temperature"] = 1.0  # OpenAI's default
    if "frequency_penalty" not in options and "presence_penalty" not in options:
        options["repeat_penalty"] = 1.0  # OpenAI applies none by default
    return options


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
    return parse_format(spec["schema"])


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages must be a non-empty list")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise InvalidRequest(f"messages[{i}].content: only text parts are supported")
                texts.append(str(part.get("text", "")))
            content = "".join(texts)
        if not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string or a list of parts")
        messages.append({"role": role, "content": content})
    return messages


class ChatCompletionsHandler(OpenAIHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.body_json()
        model = parse_model_name(body.get("model"))
        job = Job(
            model=model,
            options=sampling_from(body),
            messages=chat_messages(body.get("messages")),
            tools=body.get("tools") if isinstance(body.get("tools"), list) else None,
            format=response_format(body),
        )
        stream, with_usage = stream_flag(body), include_usage(body)
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        base = {
            "id": ident,
            "created": created,
            "model": model.display,
            "system_fingerprint": "fp_jupyter_llm",
        }
        if not stream:
            text, finished = await self._collect(job)
            self.write_json(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": FINISH.get(finished.done_reason, "stop"),
                        }
                    ],
                    "usage": usage(finished),
                }
            )
            return
        first = [True]

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

        await self._stream_sse(job, chunk, usage_chunk if with_usage else None)


class CompletionsHandler(OpenAIHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.body_json()
        model = parse_model_name(body.get("model"))
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string (or a list of one string)")
        suffix = body.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidRequest("suffix must be a string")
        job = Job(model=model, options=sampling_from(body), prompt=prompt, suffix=suffix)
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
            text, finished = await self._collect(job)
            self.write_json(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "text": text,
                            "logprobs": None,
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

        await self._stream_sse(job, chunk, usage_chunk if with_usage else None)


class EmbeddingsHandler(OpenAIHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.body_json()
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
        result = await embed(self.llm, model, inputs, dimensions=dimensions)

        def encode(vector: list[float]) -> Any:
            if encoding == "float":
                return vector
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()

        self.write_json(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": encode(v)}
                    for i, v in enumerate(result.embeddings)
                ],
                "model": model.display,
                "usage": {
                    "prompt_tokens": result.prompt_eval_count,
                    "total_tokens": result.prompt_eval_count,
                },
            }
        )


def model_object(entry: Any) -> dict[str, Any]:
    return {
        "id": entry.name.display,
        "object": "model",
        "created": int(entry.modified_at.timestamp()),
        "owned_by": entry.name.namespace,
    }


class ModelsHandler(OpenAIHandler):
    @web.authenticated
    async def get(self) -> None:
        entries = await self.blocking(self.llm.store.list)
        self.write_json({"object": "list", "data": [model_object(e) for e in entries]})


class ModelHandler(OpenAIHandler):
    @web.authenticated
    async def get(self, model: str) -> None:
        entry = await self.blocking(self.llm.store.get, parse_model_name(model))
        self.write_json(model_object(entry))


def handlers() -> list[tuple[str, type[LLMHandler]]]:
    """Routes relative to ``{base_url}llm/``."""
    return [
        (r"v1/chat/completions", ChatCompletionsHandler),
        (r"v1/completions", CompletionsHandler),
        (r"v1/embeddings", EmbeddingsHandler),
        (r"v1/models", ModelsHandler),
        (r"v1/models/(?P<model>.+)", ModelHandler),
    ]
