"""Handler base: Jupyter auth, JSON in, ``{"error": ...}`` out, never a traceback.

Every route is authenticated and authorized (all but the root heartbeat,
``ollama.RootHandler``, which is no ``LLMHandler``): each handler class names its
``auth_resource`` (``LLM`` or ``LLM_MODELS``, none is inherited from here) and
each method asks jupyter_server's ``Authorizer`` with ``@authorized(action)``:
``read`` for what is there, ``execute`` to run a model, ``write`` to change
the model store. A deployment can so allow chat but not pull or delete.

It also owns streaming (``stream``): the four loops that each handled headers,
a client gone, ``StreamClosedError``, an error after the first byte and the
final finish (Ollama NDJSON, pull progress, OpenAI chat and completion SSE)
now only encode their events. ``error_body`` is the one hook a flavour
overrides for its error shape; there is one ``write_error``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized as jupyter_authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_llm.api.generation import Job, Reply, collect, complete
from jupyter_llm.api.requests import parse_json_object
from jupyter_llm.errors import LLMError
from jupyter_llm.identity import Requester, requester_of
from jupyter_llm.limits import BODY_BYTES, DECODE_ON_LOOP_BYTES

if TYPE_CHECKING:
    from jupyter_llm.services import LLMServices

log = logging.getLogger(__name__)
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# Authorization resources (README, Security)
LLM = "llm"  # read: version, devices, tags, ps, show, models; execute: completions, embeddings
LLM_MODELS = "llm.models"  # read: blob exists; write: blobs, create, pull, copy, delete


def authorized(action: str) -> Callable[[F], F]:
    """jupyter_server's ``@authorized(action)``, the action also kept on the
    method (``action_of``), so that ``api.forward`` asks the same question of a
    request it forwards to a shared engine."""

    def decorate(method: F) -> F:
        checked = jupyter_authorized(action)(method)
        checked.llm_action = action  # type: ignore[attr-defined]
        return checked

    return decorate


def authorized_in_prepare(action: str) -> Callable[[F], F]:
    """Marks a method whose handler authorizes ``action`` in ``prepare``
    (before its body streams anywhere), as ``BlobHandler.post`` does."""

    def decorate(method: F) -> F:
        method.llm_action = action  # type: ignore[attr-defined]
        return method

    return decorate


def action_of(handler: type, method: str) -> str:
    """The action ``handler`` authorizes for HTTP ``method`` ("GET", ...)."""
    return getattr(handler, method.lower()).llm_action


TOKEN_NEEDED = (
    "this request needs a valid token: send the header 'Authorization: token <token>' "
    "(or 'Bearer <token>', as OpenAI clients send their api_key), or add '?token=<token>' "
    "to the URL. The token is the Jupyter server's (`jupyter server list` shows it; behind "
    "JupyterHub, an API token). See 'Using it over HTTP' in jupyter-llm's README."
)
HTTP_METHODS = ("GET", "HEAD", "POST", "DELETE")  # those a route may answer


def token_needed() -> web.HTTPError:
    """The 403 of a request without a (valid) token, saying how to send one:
    jupyter_server's own is a bare 403, or ``'_xsrf' argument missing`` on a
    POST, which tells an Ollama or OpenAI client nothing."""
    return web.HTTPError(403, TOKEN_NEEDED)


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


MAX_JSON_BODY = BODY_BYTES.value


@dataclass(frozen=True)
class Framing:
    """How a stream puts JSON values on the wire."""

    content_type: str
    frame: Callable[[str], str]  # one JSON text -> what is written
    trailer: str = ""  # written after the last value (or the in-stream error)
    headers: dict[str, str] = field(default_factory=dict)


NDJSON = Framing("application/x-ndjson", lambda text: text + "\n")
SSE = Framing(
    "text/event-stream",
    lambda text: f"data: {text}\n\n",
    trailer="data: [DONE]\n\n",
    headers={"Cache-Control": "no-cache"},
)


@web.stream_request_body
class LLMHandler(APIHandler):
    """Base for every jupyter-llm handler (all of them ``@web.authenticated``).

    Bodies are received in chunks and bounded (413 beyond ``max_body``), so a
    huge request is refused without being held in memory.
    """

    max_body = MAX_JSON_BODY
    _chunks: list[bytes]
    _received = 0
    _client_gone = False  # streams stop (and cancel their generation) once this is set

    def on_connection_close(self) -> None:
        self._client_gone = True
        super().on_connection_close()

    def check_xsrf_cookie(self) -> None:
        """A request that is not a GET and has no valid token is refused with
        ``token_needed``: jupyter_server would ask it for an ``_xsrf`` cookie,
        which only a browser session has. One that came with a login cookie
        (a browser) keeps jupyter_server's check."""
        if getattr(self, "_jupyter_current_user", True) is None:  # resolved: nobody
            raise token_needed()
        super().check_xsrf_cookie()

    def get_login_url(self) -> str:
        """A GET or HEAD without a valid token: ``@web.authenticated`` asks for
        a login page, which an API answers with ``token_needed`` (same 403)."""
        if not self.current_user:
            raise token_needed()
        return super().get_login_url()

    async def authorize(self, action: str) -> None:
        """What ``@authorized`` checks, for a handler that must know before its
        method runs (an upload refused before a byte goes to disk)."""
        user = self.current_user
        if not user or not await ensure_async(
            self.authorizer.is_authorized(self, user, action, self.auth_resource)
        ):
            raise web.HTTPError(
                403, f"User is not authorized to {action} on resource: {self.auth_resource}."
            )

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        self._chunks = []
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise web.HTTPError(413, f"request body is larger than {self.max_body} bytes")
        self.request.connection.set_max_body_size(self.max_body + 1)  # type: ignore[attr-defined]

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._received <= self.max_body:
            self._chunks.append(chunk)

    @property
    def llm(self) -> LLMServices:
        """The extension's services, set in the tornado settings by the app."""
        return self.settings["jupyter_llm"]

    @property
    def requester(self) -> Requester:
        """Who asks: ``local`` on a plain server, the Hub's user behind JupyterHub."""
        return requester_of(self.current_user)

    def read_json(self) -> dict[str, Any]:
        """The body as a JSON object, parsed where this is called: inside
        ``blocking`` for a parse that does more than decode."""
        if self._received > self.max_body:
            raise web.HTTPError(413, f"request body is larger than {self.max_body} bytes")
        return parse_json_object(b"".join(self._chunks))

    async def body_json(self) -> dict[str, Any]:
        """The body as a JSON object; a body of more than a few KiB is decoded
        off the event loop (32 MiB of JSON takes seconds), so other users'
        requests keep being answered meanwhile."""
        if self._received <= DECODE_ON_LOOP_BYTES:
            return self.read_json()
        return await self.blocking(self.read_json)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run file-system work off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(value))

    # -- streaming -----------------------------------------------------------------
    async def connected(self, source: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """``source``'s items while the client is still there. However this
        ends (the client left, the consumer stopped, an error), ``source`` is
        closed, which cancels a generation and releases its runner. Use it
        under ``contextlib.aclosing``."""
        try:
            async for item in source:
                if self._client_gone:
                    return
                yield item
        finally:
            await source.aclose()

    async def stream(self, batches: AsyncGenerator[list[Any], None], framing: Framing) -> None:
        """Send each batch of JSON values as it comes, flushed.

        An error before the first byte propagates, so the client gets a plain
        error response with its status; after it, the error is the stream's
        last value (``{"error": error_body(...)}``) and the stream ends with
        the trailer. A client that leaves ends the loop and closes ``batches``.
        """
        begun = False
        try:
            async with aclosing(self.connected(batches)) as items:
                async for values in items:
                    if not values:
                        continue
                    if not begun:
                        self._begin(framing)
                        begun = True
                    self.write("".join(framing.frame(json.dumps(v)) for v in values))
                    await self.flush()
        except StreamClosedError:
            return  # the client left while we wrote: batches are closed already
        except Exception as e:
            if not begun:
                raise
            status, message = self._error_of(e)
            if status >= 500 and not isinstance(e, LLMError):
                log.exception("%s %s failed mid-stream", self.request.method, self.request.path)
            self.write(framing.frame(json.dumps({"error": self.error_body(status, message)})))
        if self._client_gone:
            return
        if not begun:
            self._begin(framing)
        self.write(framing.trailer)
        self.finish()

    async def whole_completion(self, job: Job) -> Reply | None:
        """A completion not streamed: its text and last event, or ``None`` if
        the client left (which cancelled the generation)."""
        async with aclosing(self.connected(complete(self.llm, job, self.requester))) as batches:
            result = await collect(batches)
        if result is None and not self._client_gone:
            raise LLMError("the runner ended without finishing")
        return result

    def _begin(self, framing: Framing) -> None:
        self.set_header("Content-Type", framing.content_type)
        for name, value in framing.headers.items():
            self.set_header(name, value)

    # -- errors --------------------------------------------------------------------
    def error_body(self, status: int, message: str) -> Any:
        """The value of ``"error"`` in an error response: Ollama's is the message."""
        return message

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, LLMError):
            status_code = exc.status
        super().send_error(status_code, **kwargs)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, LLMError) and value.status < 500:
            log.info("%s %s: %s", self.request.method, self.request.path, value)
        else:
            super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        _, message = self._error_of(exc, status_code)
        if status_code == 405:  # say which methods the route has (tornado's is bare)
            allowed = self.allowed_methods()
            self.set_header("Allow", ", ".join(allowed))
            message = (
                f"{self.request.method} is not a method of {self.request.path}; "
                f"it answers {', '.join(allowed) or 'none'}"
            )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": self.error_body(status_code, message)}))

    def allowed_methods(self) -> list[str]:
        """The methods this route answers (a forwarded route: its engine's)."""
        handler = getattr(self, "stands_for", type(self))
        return [m for m in HTTP_METHODS if hasattr(getattr(handler, m.lower(), None), "llm_action")]

    def _error_of(self, exc: BaseException | None, status: int = 500) -> tuple[int, str]:
        """The status and the message a client reads for ``exc``, never a traceback."""
        if isinstance(exc, LLMError):
            return exc.status, str(exc)
        if isinstance(exc, web.HTTPError):
            message = exc.log_message or exc.reason or self._reason
            if exc.args and exc.log_message and "%" in exc.log_message:
                message = exc.log_message % exc.args
            return exc.status_code, message
        if status >= 500:
            return status, f"internal error: {type(exc).__name__}" if exc else self._reason
        return status, self._reason
