"""A user's server without its own engine: every ``{base_url}llm/`` route is
forwarded to a shared one (``jupyter llm serve`` behind JupyterHub), so that
``%%llm``, ``jupyter_llm.client()``, the CLI and the sidebar, which all talk to
their own server, use the one scheduler of the machine.

The routes are the engine's own (``api.handlers``), each asking the local
``Authorizer`` the same (action, resource) as the handler it stands for,
before anything is sent on. The request goes on as this server's user: with
the engine token (``Settings.engine_token``: by default the Hub's token of this
server, ``$JUPYTERHUB_API_TOKEN``, held by this server's user). Bodies stream
both ways as they come (a blob upload is never held in memory, a generation's
tokens are never buffered); the engine's status, headers that matter and error
bodies arrive unchanged. A client that leaves closes the upstream connection,
which cancels its generation in the engine.

The forwarded request never leaves the engine's prefix: a path with a ``.``
or ``..`` segment, raw or percent-encoded (any number of times, with ``/`` or
``\\`` as separator), is a 400 before anything is sent; the engine's path is
rebuilt from the route with its parameters quoted again (an encoded ``/`` in
a digest stays encoded); and the final URL is checked to start with the
engine's URL. Otherwise ``v1/models/../../hub/api/user`` would reach the
engine's host at ``/hub/api/user`` carrying the engine token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_llm.api import NotFoundHandler
from jupyter_llm.api.base import NDJSON, SSE, Framing, LLMHandler, action_of
from jupyter_llm.api.ollama import RootHandler
from jupyter_llm.config import Settings
from jupyter_llm.request.errors import EngineUnreachable, InvalidRequest
from jupyter_llm.request.origin import HEADERS as ORIGIN_HEADERS
from jupyter_llm.request.priority import HEADER as PRIORITY_HEADER

log = logging.getLogger(__name__)

BODY_METHODS = ("POST", "DELETE")
# the request priority reaches the shared engine, whose scheduler applies it;
# the kernel and cell, which its usage table counts under
REQUEST_HEADERS = ("Content-Type", "Content-Length", "Accept", PRIORITY_HEADER, *ORIGIN_HEADERS)
RESPONSE_HEADERS = ("Content-Type", "Cache-Control")
BODY_QUEUE = 4  # chunks in flight between the client and the engine (back-pressure)
# a path decoded more often than this is refused: nobody encodes a name five times
MAX_DECODES = 5
_SEPARATORS = re.compile(r"[/\\]")
_PARAMETER = re.compile(r"\(\?P<(\w+)>([^)]*)\)")  # a route's named group
LOCAL = (RootHandler, NotFoundHandler)  # routes this server answers itself


@dataclass
class SharedEngine:
    """Where the shared engine is (its API base URL, ending in "/") and the
    one HTTP client (connection pool) this server uses to reach it."""

    url: str
    client: httpx.AsyncClient

    @classmethod
    def connect(cls, settings: Settings) -> SharedEngine:
        headers = {"Accept-Encoding": "identity"}  # bytes pass through as sent
        if settings.engine_token:
            headers["Authorization"] = f"token {settings.engine_token}"
        client = httpx.AsyncClient(
            headers=headers,
            # a generation or a pull takes as long as it takes; connecting does not
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
        )
        return cls(settings.engine_url, client)

    async def close(self) -> None:
        await self.client.aclose()


class ForwardHandler(LLMHandler):
    """One engine route, forwarded. Subclassed per route by ``forwarding``."""

    stands_for: type[LLMHandler]  # the engine's handler of this route
    route: str  # its pattern, relative to ``{base_url}llm/``
    _upstream: asyncio.Future[httpx.Response] | None = None
    _relay: asyncio.Future[None] | None = None
    _body: asyncio.Queue[bytes | None]

    @property
    def engine(self) -> SharedEngine:
        return self.settings["jupyter_llm_engine"]

    def error_body(self, status: int, message: str) -> Any:
        return self.stands_for.error_body(self, status, message)  # type: ignore[arg-type]

    def error_value(self, status: int, message: str) -> Any:
        return self.stands_for.error_value(self, status, message)  # type: ignore[arg-type]

    def token_refused(self) -> web.HTTPError:
        return self.stands_for.token_refused(self)  # type: ignore[arg-type]

    async def prepare(self) -> None:  # type: ignore[override]
        """Authorize as the engine's handler would, then start the request so
        that the body streams on as it arrives."""
        await super().prepare()
        if self.current_user is None:
            raise web.HTTPError(403)
        method = self.request.method or "GET"
        if not hasattr(getattr(self.stands_for, method.lower(), None), "llm_action"):
            raise web.HTTPError(405)  # not a method of this route (was a 500 here)
        await self.authorize(action_of(self.stands_for, method))
        self._body = asyncio.Queue(BODY_QUEUE)
        content = self._body_chunks() if method in BODY_METHODS else None
        headers = {k: v for k in REQUEST_HEADERS if (v := self.request.headers.get(k))}
        request = self.engine.client.build_request(
            method, self._upstream_url(), headers=headers, content=content
        )
        self._upstream = asyncio.ensure_future(self.engine.client.send(request, stream=True))

    def _upstream_url(self) -> httpx.URL:
        """The engine's URL of this request: the route rebuilt under the
        engine's URL, with its parameters quoted again; a path that could
        step out of ``{base_url}llm/`` is refused (400), never sent."""
        prefix = f"{self.base_url.rstrip('/')}/llm"
        raw = self.request.path[len(prefix) :]
        if has_dot_segment(raw) or any(map(has_dot_segment, self.path_kwargs.values())):
            raise InvalidRequest(
                "invalid path: '.' and '..' segments (raw or percent-encoded) are not allowed"
            )
        query = f"?{self.request.query}" if self.request.query else ""
        return inside(self.engine.url, f"{route_path(self.route, self.path_kwargs)}{query}")

    async def _body_chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._body.get()) is not None:
            yield chunk

    async def data_received(self, chunk: bytes) -> None:  # type: ignore[override]
        await self._feed(chunk)

    async def _feed(self, item: bytes | None) -> None:
        """Hand ``item`` to the upstream body, waiting while it is behind; an
        engine that has answered already takes nothing more."""
        upstream = self._upstream
        if upstream is None or upstream.done():
            return
        put = asyncio.ensure_future(self._body.put(item))
        await asyncio.wait({put, upstream}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()

    async def forward(self, *args: Any, **kwargs: Any) -> None:
        assert self._upstream is not None
        await self._feed(None)  # the body is complete
        try:
            response = await self._upstream
        except asyncio.CancelledError:
            if self._client_gone:
                return
            raise
        except httpx.HTTPError as e:
            raise EngineUnreachable(
                f"cannot reach the jupyter-llm engine at {self.engine.url}: "
                f"{str(e) or type(e).__name__}"
            ) from None
        try:
            self._relay = asyncio.ensure_future(self._send_back(response))
            await self._relay
        except asyncio.CancelledError:
            if not self._client_gone:
                raise
        finally:
            await response.aclose()  # unread: the connection closes, the engine stops

    async def _send_back(self, response: httpx.Response) -> None:
        self.set_status(response.status_code, response.reason_phrase or "Unknown")
        for name in RESPONSE_HEADERS:
            if value := response.headers.get(name):
                self.set_header(name, value)
        content_type = response.headers.get("Content-Type", "application/json")
        if self.request.method == "HEAD":
            if length := response.headers.get("Content-Length"):
                self.set_header("Content-Length", length)
            self.finish(set_content_type=content_type)
            return
        framing = FRAMINGS.get(content_type.split(";")[0].strip())
        at_boundary = True  # what was sent ends with a whole frame
        try:
            async for chunk in response.aiter_raw():
                if self._client_gone:
                    return
                self.write(chunk)
                await self.flush()
                at_boundary = chunk.endswith(framing.end) if framing else False
        except StreamClosedError:
            return  # the client left while we wrote
        except httpx.HTTPError as e:  # the engine went away mid-answer
            message = f"the jupyter-llm engine's answer broke off: {str(e) or type(e).__name__}"
            log.warning("%s: %s", self.request.path, message)
            if framing is None or not at_boundary or response.status_code != 200:
                self.request.connection.close()  # type: ignore[attr-defined]
                return  # nothing whole to end it with: cut it short
            # a stream ends as the engine's own streams end on an error
            error = json.dumps({"error": self.error_body(502, message)})
            self.write(framing.framing.frame(error) + framing.framing.trailer)
        self.finish(set_content_type=content_type)

    def on_connection_close(self) -> None:
        super().on_connection_close()
        for work in (self._relay, self._upstream):
            _drop(work)

    def on_finish(self) -> None:
        _drop(self._upstream)  # answered here (an error) before the engine's answer was read


@dataclass(frozen=True)
class StreamShape:
    """A streamed answer's framing, and how its every whole frame ends."""

    framing: Framing
    end: bytes


FRAMINGS = {f.content_type: StreamShape(f, e) for f, e in ((NDJSON, b"\n"), (SSE, b"\n\n"))}


def _drop(work: asyncio.Future[Any] | None) -> None:
    """Cancel ``work`` if it still runs; if it failed, its error is known already."""
    if work is None:
        return
    if not work.done():
        work.cancel()
    elif not work.cancelled():
        work.exception()  # retrieved: no "exception was never retrieved" later


def has_dot_segment(path: str) -> bool:
    """Whether ``path``, percent-decoded up to ``MAX_DECODES`` times, has a
    ``.`` or ``..`` segment anywhere a server or a proxy on the way might
    resolve it (``/`` and ``\\`` both separate); deeper encodings count as one."""
    for _ in range(MAX_DECODES):
        if any(part in (".", "..") for part in _SEPARATORS.split(path)):
            return True
        decoded = unquote(path)
        if decoded == path:
            return False
        path = decoded
    return True


def route_path(route: str, values: dict[str, str]) -> str:
    """``route`` (``"v1/models/(?P<model>.+)"``) with each named group replaced
    by its decoded value quoted again: ``/`` stays only in a parameter whose
    pattern allows it (a model's namespace), so ``%2f`` in a digest stays one
    segment; ``?``, ``#`` and ``%`` never pass unquoted."""

    def value(group: re.Match[str]) -> str:
        text = values[group[1]]
        slash = "/" if re.fullmatch(group[2], "/") else ""
        return quote(text, safe=":@" + slash)

    return _PARAMETER.sub(value, route)


def inside(base: str, path: str) -> httpx.URL:
    """``base`` + ``path`` as httpx will send it, asserted to stay under
    ``base`` (same origin, path starting with base's path): 400 otherwise."""
    root, url = httpx.URL(base), httpx.URL(base + path)
    if (url.scheme, url.host, url.port) != (root.scheme, root.host, root.port) or (
        not url.raw_path.startswith(root.raw_path)
    ):
        raise InvalidRequest("invalid path: it would leave the engine's API")
    return url


def forwarding(handler: type[LLMHandler], route: str) -> type[ForwardHandler]:
    """The forwarding handler of ``handler``'s route (its pattern, relative to
    ``{base_url}llm/``): the same methods, the same authorization resource and
    body limit, the same error shape."""
    methods = {
        name: web.authenticated(ForwardHandler.forward)
        for name in ("get", "head", "post", "delete")
        if hasattr(getattr(handler, name, None), "llm_action")
    }
    return type(
        f"Forward{handler.__name__}",
        (ForwardHandler,),
        {
            **methods,
            "stands_for": handler,
            "route": route,
            "auth_resource": handler.auth_resource,
            "max_body": handler.max_body,
            "api_key_header": handler.api_key_header,
        },
    )


def handlers(routes: list[tuple[str, type]]) -> list[tuple[str, type]]:
    """``routes`` (the engine's, ``api.handlers()``) with each handler forwarded;
    the heartbeat and the catch-all 404 answer here (an unknown path has
    nothing to ask the engine, and is never sent anywhere)."""
    return [
        (pattern, handler if handler in LOCAL else forwarding(handler, pattern))
        for pattern, handler in routes
    ]


__all__ = ["ForwardHandler", "SharedEngine", "forwarding", "handlers"]
