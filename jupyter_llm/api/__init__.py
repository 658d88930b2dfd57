"""HTTP API under ``{base_url}llm/``: Ollama-compatible (``api/``) and
OpenAI-compatible (``v1/``) handlers, and a JSON 404 for every other path."""

from __future__ import annotations

from typing import Any

from tornado import web

from jupyter_llm.api import (
    anthropic,
    history,
    ollama,
    openai,
    openai_responses,
    openai_shapes,
    plan,
    usage,
)
from jupyter_llm.api.base import LLMHandler, token_needed

# A path that no route takes, with a trailing "/" too: jupyter_server's
# TrailingSlashHandler would answer those with a redirect (GET) or an HTML 403.
UNKNOWN = r"(?P<path>.+)"
SHOWN_PATH = 200  # characters of a path quoted back in a 404


class NotFoundHandler(LLMHandler):
    """Any other path under ``{base_url}llm/``: a 404 in the error shape of the
    API it is under (OpenAI's under ``v1/``, Ollama's elsewhere), so that a
    client reports what went wrong instead of choking on jupyter_server's
    HTML page.

    Like every route but the heartbeat, it needs a token (without one, the
    403 that says how to send it), as jupyter_server's own 404 does under
    ``allow_unauthenticated_access = False`` (under its default, anyone gets
    that HTML 404): which paths exist is told only to a client with a token.
    It asks the ``Authorizer`` nothing, because it reads nothing. It answers
    in ``prepare``, so a body sent with the request is never read.
    """

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        if self.current_user is None:  # allow_unauthenticated_access left these through
            raise self.token_refused()
        path = self.path_kwargs["path"]
        shown = self.request.path
        if len(shown) > SHOWN_PATH:
            shown = shown[:SHOWN_PATH] + "..."
        why = (
            "is not a route this server has: Ollama's API is under llm/api/ and "
            "OpenAI's under llm/v1/ (GET llm/v1/models lists the models)"
        )
        if path.endswith("/"):
            why += "; routes take no trailing '/'"
        raise web.HTTPError(404, "%s " + why, shown)  # the path as an argument: it may hold "%"

    def under_v1(self) -> bool:
        return self.path_kwargs.get("path", "").split("/", 1)[0] == "v1"

    def error_body(self, status: int, message: str) -> Any:
        """OpenAI's shape under ``v1/`` (its ``type`` for an unknown URL), Ollama's elsewhere."""
        if self.under_v1():
            return {**openai_shapes.openai_error(status, message), "type": "invalid_request_error"}
        return message

    def token_refused(self) -> web.HTTPError:
        """Under ``v1/``, OpenAI's 401, as its routes answer."""
        return openai.key_refused() if self.under_v1() else token_needed()


def handlers() -> list[tuple[str, type]]:
    """Every route, relative to ``{base_url}llm/``: the one list the app
    mounts; the catch-all last."""
    return [
        *ollama.handlers(),
        *plan.handlers(),
        *usage.handlers(),
        *history.handlers(),
        *openai.handlers(),
        *openai_responses.handlers(),
        *anthropic.handlers(),
        (UNKNOWN, NotFoundHandler),
    ]


__all__ = ["NotFoundHandler", "handlers"]
