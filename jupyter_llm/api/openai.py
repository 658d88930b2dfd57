"""OpenAI-compatible handlers under ``{base_url}llm/v1/``: chat completions,
completions, embeddings and models, streaming as server-sent events.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
which the ``openai`` client turns into its exceptions: ``OpenAIHandler``
only overrides ``error_body`` (the base's one ``write_error`` and its stream
use it). Bodies become a generation request, and generations OpenAI's
objects, in ``api/openai_shapes.py``; the handlers parse, call and write.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from jupyter_llm.api.base import (
    COMPACT,
    LLM,
    SSE,
    TOKEN_NEEDED,
    LLMHandler,
    authorized,
    json_pieces,
)
from jupyter_llm.api.generation import embed
from jupyter_llm.api.openai_shapes import (
    ChatChunks,
    CompletionChunks,
    chat_call,
    chat_completion,
    completion_call,
    embeddings_body,
    embeddings_call,
    header,
    model_object,
    openai_error,
    text_completion,
)
from jupyter_llm.models.names import parse_model_name


class OpenAIHandler(LLMHandler):
    def error_body(self, status: int, message: str) -> Any:
        return openai_error(status, message)

    def token_refused(self) -> web.HTTPError:
        return key_refused()


def key_refused() -> web.HTTPError:
    """OpenAI's 401 for a missing or wrong key, on every path under ``v1/``:
    the client raises its ``AuthenticationError`` (a 403 is its
    ``PermissionDeniedError``)."""
    return web.HTTPError(401, TOKEN_NEEDED)


class ChatCompletionsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        # images, tool schemas and the grammar are CPU work: off the event loop
        call = await self.blocking(chat_call, body)
        request = call.generation
        head = header("chatcmpl", request.model.as_written)
        if call.stream:
            chunks = ChatChunks(head, call.include_usage)
            await self.stream_generation(request, chunks.batch, SSE)
        elif (reply := await self.whole_completion(request)) is not None:  # None: the client left
            # each call's arguments become JSON text: with many calls, 1.3M values took
            # 60-140 ms, so the answer is shaped off the loop
            logprobs = request.logprobs is not None
            await self.write_answer(await self.blocking(chat_completion, head, reply, logprobs))


class CompletionsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        call = completion_call(await self.body_json())
        request = call.generation
        head = header("cmpl", request.model.as_written)
        if call.stream:
            chunks = CompletionChunks(head, call.include_usage)
            await self.stream_generation(request, chunks.batch, SSE)
        elif (reply := await self.whole_completion(request)) is not None:  # None: the client left
            # up to 256 Ki logprobs entries reshaped (whole_logprobs): off the loop
            logprobs = request.logprobs is not None
            await self.write_answer(await self.blocking(text_completion, head, reply, logprobs))


class EmbeddingsHandler(OpenAIHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        req = embeddings_call(await self.body_json())
        result = await embed(
            self.llm,
            req.model,
            req.inputs,
            dimensions=req.dimensions,
            encoding=req.encoding,  # the runner writes base64 itself
            requester=self.requester,
        )
        body = embeddings_body(req.model.as_written, result)
        await self.write_json_pieces(json_pieces(body, COMPACT))


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
