"""OpenAI's Responses API, ``POST {base_url}llm/v1/responses``: whole, or
streamed as its typed server-sent events (``event: response.*``, no ``[DONE]``).

Stateless unless ``previous_response_id`` names a response this user stored
(``store``, true by default): its conversation goes before the new input
(``api/response_store.py``, bounded, in memory). ``GET`` and ``DELETE
/v1/responses/{id}`` read and forget a stored response. Errors use OpenAI's shape;
a stream's error is an ``error`` event the ``openai`` client raises.
Bodies become a generation request in ``api/openai_responses_shapes.py``,
and generations responses in ``api/openai_responses_output.py``.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from jupyter_llm.api.base import LLM, NAMED_SSE, authorized
from jupyter_llm.api.generation import Event
from jupyter_llm.api.openai import OpenAIHandler
from jupyter_llm.api.openai_responses_output import Head, ResponseEvents, stored_turn, whole_output
from jupyter_llm.api.openai_responses_shapes import (
    ResponsesCall,
    conversation_bytes,
    identifier,
    previous_id,
    responses_call,
)
from jupyter_llm.api.openai_shapes import openai_error
from jupyter_llm.api.requests import checked
from jupyter_llm.api.response_store import ResponseStore, Stored
from jupyter_llm.request.errors import InvalidRequest, LLMError
from jupyter_llm.request.limits import CONVERSATION_BYTES


class ResponseNotFound(LLMError):
    status = 404


STORE = "jupyter_llm_response_store"  # the app's one store, in tornado's settings


class ResponseStoreHandler(OpenAIHandler):
    """What both routes share: the app's one store, and whose entries these are."""

    auth_resource = LLM

    @property
    def store(self) -> ResponseStore:
        return self.settings.setdefault(STORE, ResponseStore())

    @property
    def user_key(self) -> str:
        """Whose stored responses these are: the Hub's user, or the server's own."""
        username = getattr(self.current_user, "username", "") or ""
        return f"{self.requester.name}/{username}"


class ResponsesHandler(ResponseStoreHandler):
    def error_value(self, status: int, message: str) -> Any:
        # a stream's error is an "error" event; a whole answer's, OpenAI's error object
        return {"type": "error", "error": openai_error(status, message)}

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = await self.body_json()
        history: list[dict[str, Any]] = []
        if (previous := previous_id(body)) is not None:
            found = self.store.get(self.user_key, previous)
            if found is None:
                raise ResponseNotFound(
                    f"previous_response_id {previous!r} was not found: it was never stored "
                    "for this user (store: false), or it expired or was evicted"
                )
            history = found
        # images, tool schemas and the grammar are CPU work: off the event loop
        call = await self.blocking(responses_call, body, history)
        head = Head(call.generation.model.as_written, call.echo, call.previous_response_id)
        asked = [*history, *call.chat]
        size = await self.blocking(conversation_bytes, asked) if call.store or history else 0
        if history:  # a chain of responses sends the runner what one body could
            checked(CONVERSATION_BYTES.check, "previous_response_id's conversation", size)
        if call.stream:
            events = ResponseEvents(head)

            def encode(batch: list[Event]) -> list[Any]:
                out = events.batch(batch)
                if events.finished is not None:  # stored before the client reads it is done
                    done = head.response(events.output, events.finished)
                    self.keep(call, asked, size, done)
                return out

            await self.stream_generation(call.generation, encode, NAMED_SSE)
        elif (reply := await self.whole_completion(call.generation)) is not None:
            done = head.response(whole_output(reply), reply.finished)
            self.keep(call, asked, size, done)
            await self.write_answer(done)

    def keep(self, call: ResponsesCall, asked: list[Any], size: int, done: dict[str, Any]) -> None:
        """Store the conversation for ``previous_response_id``, unless ``store:
        false``: what was asked (measured off the loop), the answer, and the
        response object for ``GET``."""
        if call.store:
            turn = stored_turn(done["output"])
            size += conversation_bytes([turn, done])
            self.store.put(self.user_key, done["id"], [*asked, turn], size, done)


class StoredResponseHandler(ResponseStoreHandler):
    """``/v1/responses/{id}``: a stored response, whole (``GET``), or
    forgotten (``DELETE``); another user's is "not found", as at OpenAI."""

    def found(self, response_id: str) -> Stored:
        entry = self.store.find(self.user_key, identifier(response_id, "response id"))
        if entry is None or entry.response is None:
            raise ResponseNotFound(
                f"response {response_id[:128]!r} was not found: it was never stored for this "
                "user (store: false), or it expired, was evicted or was deleted"
            )
        return entry

    @web.authenticated
    @authorized("read")
    async def get(self, response_id: str) -> None:
        if self.get_query_argument("stream", "false").lower() == "true":
            raise InvalidRequest("a stored response cannot be streamed again: omit stream")
        await self.write_answer(self.found(response_id).response)

    @web.authenticated
    @authorized("execute")
    async def delete(self, response_id: str) -> None:
        if self._received:  # none is expected, but one is parsed as every body is
            await self.body_json()
        self.found(response_id)
        self.store.remove(self.user_key, response_id)
        self.write_json({"id": response_id, "object": "response", "deleted": True})


def handlers() -> list[tuple[str, type[ResponseStoreHandler]]]:
    """Routes relative to ``{base_url}llm/``."""
    return [
        (r"v1/responses", ResponsesHandler),
        (r"v1/responses/(?P<response_id>[^/]+)", StoredResponseHandler),
    ]
