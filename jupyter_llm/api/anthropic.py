"""Anthropic-compatible handlers under ``{base_url}llm/v1/``: ``messages``
(whole or streamed as Anthropic's named server-sent events) and
``messages/count_tokens``.

The Jupyter token is the API key: in ``x-api-key`` as Anthropic's clients
send it, or as a bearer token. The key is handed to jupyter_server's own
identity provider as a bearer token (``LLMHandler.api_key_as_bearer``), so
it is checked as every other route's token is, and only these routes read
that header. Errors, a missing or wrong key included (401), use Anthropic's
shape, ``{"type": "error", "error": {"type", "message"}}``, which the
``anthropic`` client turns into its exceptions. Bodies become a generation
request, and generations Anthropic's objects, in ``api/anthropic_shapes.py``.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from jupyter_llm.api.anthropic_shapes import (
    MessageEvents,
    anthropic_error,
    count_call,
    message,
    messages_call,
)
from jupyter_llm.api.base import LLM, NAMED_SSE, LLMHandler, authorized

KEY_NEEDED = (
    "this request needs a valid API key: the Jupyter server's token, in the header "
    "'x-api-key: <token>' (the anthropic client's api_key) or 'Authorization: Bearer <token>'. "
    "`jupyter server list` shows it; see 'Using it over HTTP' in jupyter-llm's README."
)


class AnthropicHandler(LLMHandler):
    api_key_header = "x-api-key"

    def error_value(self, status: int, message: str) -> Any:
        return anthropic_error(status, message)

    def token_refused(self) -> web.HTTPError:
        return web.HTTPError(401, KEY_NEEDED)


class MessagesHandler(AnthropicHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        # images, tool schemas and the grammar are CPU work: off the event loop
        call = await self.blocking(messages_call, body)
        request = call.generation
        if call.stream:
            events = MessageEvents(request.model.as_written)
            await self.stream_generation(request, events.batch, NAMED_SSE)
        elif (reply := await self.whole_completion(request)) is not None:  # None: the client left
            await self.write_answer(message(request.model.as_written, reply))


class CountTokensHandler(AnthropicHandler):
    """The prompt's tokens as the model sees them: the chat rendered by its
    template (with tools, thinking and images) and tokenized by its runner,
    which evaluates the prompt and generates nothing; the next request with
    the same beginning reuses what it cached."""

    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        request = await self.blocking(count_call, body)
        if (reply := await self.whole_completion(request)) is not None:
            self.write_json({"input_tokens": reply.finished.prompt_eval_count})


def handlers() -> list[tuple[str, type[LLMHandler]]]:
    """Routes relative to ``{base_url}llm/``."""
    return [
        (r"v1/messages", MessagesHandler),
        (r"v1/messages/count_tokens", CountTokensHandler),
    ]
