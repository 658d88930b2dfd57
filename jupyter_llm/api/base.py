"""Handler base: Jupyter auth, JSON in, ``{"error": ...}`` out, never a traceback.

Every route is authenticated and authorized (all but the root heartbeat,
``ollama.RootHandler``, which is no ``LLMHandler``): each handler class names its
``auth_resource`` (``LLM`` or ``LLM_MODELS``, none is inherited from here) and
each method asks jupyter_server's ``Authorizer`` with ``@authorized(action)``:
``read`` for what is there, ``execute`` to run a model, ``write`` to change
the model store. A deployment can so allow chat but not pull or delete.

It also owns streaming (``stream``, ``stream_generation``): headers, a client
gone, ``StreamClosedError``, an error after the first byte and the final
finish, for Ollama's NDJSON and OpenAI's SSE alike, so that handlers only
encode their values; and the writing of large JSON answers a piece at a
time (``json_pieces``, ``write_json_pieces``). ``error_body`` is the one hook
a flavour overrides for its error shape; there is one ``write_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized as jupyter_authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_llm.api.generation import Event, GenerationRequest, Reply, collect, complete
from jupyter_llm.api.requests import checked, parse_json_object
from jupyter_llm.metrics.instruments import ROUTE
from jupyter_llm.request.errors import LLMError
from jupyter_llm.request.held_bodies import HeldBodies
from jupyter_llm.request.identity import Requester, requester_of
from jupyter_llm.request.json_size import small
from jupyter_llm.request.limits import BODY_BYTES, DECODE_ON_LOOP_BYTES
from jupyter_llm.request.origin import ORIGIN, parse_origin
from jupyter_llm.request.priority import HEADER as PRIORITY_HEADER
from jupyter_llm.request.priority import resolve as resolve_priority

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


MAX_JSON_BODY = BODY_BYTES.value
HELD_BODIES = "jupyter_llm_held_bodies"  # the tornado setting holding ``HeldBodies``

JSON_PIECE = 1 << 16  # characters encoded in one call: well under a millisecond
LIST_PIECE = JSON_PIECE // 16  # list items encoded in one call
FLUSH_CHARS = 1 << 20  # written to the client before more is encoded
# a stream whose client has read nothing for this long is closed (its generation
# cancelled, its runner slot freed): a connection left open but never read
STALLED_CLIENT_SECONDS = 120
JSON_SEPARATORS = (", ", ": ")  # json.dumps's
COMPACT = (",", ":")


class RawJSON:
    """A value already encoded as JSON, in pieces, that ``json_pieces`` writes
    as it is (the vectors a runner encoded, never decoded here)."""

    def __init__(self, pieces: Iterable[str]) -> None:
        self.pieces = pieces


def json_array(items: Iterable[str]) -> RawJSON:
    """Items that are JSON texts, as one JSON array, joined a piece of about
    ``JSON_PIECE`` characters at a time."""

    def pieces() -> Iterator[str]:
        group: list[str] = []
        size = 0
        sep = "["
        for item in items:
            group.append(item)
            size += len(item)
            if size >= JSON_PIECE:
                yield sep + ",".join(group)
                group, size, sep = [], 0, ","
        yield sep + ",".join(group) + "]" if group else ("[]" if sep == "[" else "]")

    return RawJSON(pieces())


def json_pieces(value: Any, separators: tuple[str, str] = JSON_SEPARATORS) -> Iterator[str]:
    """``value`` as JSON text in pieces of about ``JSON_PIECE`` characters:
    ``RawJSON`` as it is, a long string or list a piece at a time with the GIL
    handed over between pieces. ``json.dumps`` holds the GIL for its whole
    call (10-40 ms for a 4 MiB template or a verbose vocabulary), which
    stalls the event loop even from an executor thread. ``separators`` are
    the outer object's; what it holds is written as ``json.dumps`` writes it."""
    item_sep, key_sep = separators
    if isinstance(value, RawJSON):
        yield from value.pieces
    elif isinstance(value, str) and len(value) > JSON_PIECE:
        yield '"'
        for i in range(0, len(value), JSON_PIECE):  # escapes are per character
            yield json.dumps(value[i : i + JSON_PIECE])[1:-1]
            time.sleep(0)  # hand the GIL to the event loop if it waits
        yield '"'
    elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        sep = "{"
        for key, item in value.items():
            yield f"{sep}{json.dumps(key)}{key_sep}"
            yield from json_pieces(item)
            sep = item_sep
        yield "}"
    elif isinstance(value, list | tuple) and len(value) > LIST_PIECE:
        sep = "["
        for i in range(0, len(value), LIST_PIECE):
            yield sep + json.dumps(list(value[i : i + LIST_PIECE]))[1:-1]
            sep = ", "
            time.sleep(0)
        yield "]"
    else:
        yield json.dumps(value)


def next_chunk(pieces: Iterator[str], size: int = FLUSH_CHARS) -> bytes:
    """The next ``size`` characters or so of ``pieces`` (``json_pieces``) as
    UTF-8, ``b""`` at their end: one step of an answer encoded off the loop
    as it is written, where neither the encoding nor a fresh multi-MiB
    buffer stalls the loop."""
    group: list[str] = []
    held = 0
    for piece in pieces:
        group.append(piece)
        held += len(piece)
        if held >= size:
            break
    return "".join(group).encode()


@dataclass(frozen=True)
class Framing:
    """How a stream puts JSON values on the wire."""

    content_type: str
    frame: Callable[[str], str]  # one JSON text -> what is written
    trailer: str = ""  # written after the last value (or the in-stream error)
    headers: dict[str, str] = field(default_factory=dict)
    named: bool = False  # each SSE event named by its value's "type" (Anthropic's streams)

    def encode(self, value: Any) -> str:
        """One value as written on the wire."""
        return self._framed(value, json.dumps(value))

    def encode_in_pieces(self, value: Any) -> str:
        """``encode`` for a large value, off the loop: ``json_pieces`` hands
        the GIL over between pieces, where one ``json.dumps`` holds it."""
        return self._framed(value, "".join(json_pieces(value)))

    def _framed(self, value: Any, text: str) -> str:
        framed = self.frame(text)
        return f"event: {value['type']}\n{framed}" if self.named else framed


NDJSON = Framing("application/x-ndjson", lambda text: text + "\n")
SSE = Framing(
    "text/event-stream",
    lambda text: f"data: {text}\n\n",
    trailer="data: [DONE]\n\n",
    headers={"Cache-Control": "no-cache"},
)
NAMED_SSE = Framing(  # event: <type> before each data line, no [DONE]
    "text/event-stream",
    lambda text: f"data: {text}\n\n",
    headers={"Cache-Control": "no-cache"},
    named=True,
)


@web.stream_request_body
class LLMHandler(APIHandler):
    """Base for every jupyter-llm handler (all of them ``@web.authenticated``).

    Bodies are received in chunks and bounded (413 beyond ``max_body``), so a
    huge request is refused without being held in memory.
    """

    max_body = MAX_JSON_BODY
    # a header that may carry the token instead of Authorization (Anthropic's
    # x-api-key): read as a bearer token by jupyter_server's identity provider
    api_key_header: str | None = None
    _chunks: list[bytes]
    _received = 0
    _held = 0  # bytes of this body taken from its user's share (``HeldBodies``)
    _over_share = False  # its user's share ran out while it arrived: refused (429)
    _client_gone = False  # streams stop (and cancel their generation) once this is set

    _gone: asyncio.Event | None = None  # set when the client leaves (``until_gone``)

    def on_connection_close(self) -> None:
        if not self._body_arrived():  # a request that runs on holds its body until it ends
            self._give_back_body()
        self._client_gone = True
        if self._gone is not None:
            self._gone.set()
        super().on_connection_close()

    async def until_gone(self) -> None:
        """Returns once the client has left."""
        if self._gone is None:
            self._gone = asyncio.Event()
            if self._client_gone:
                self._gone.set()
        await self._gone.wait()

    def check_xsrf_cookie(self) -> None:
        """A request that is not a GET and has no valid token is refused with
        ``token_needed``: jupyter_server would ask it for an ``_xsrf`` cookie,
        which only a browser session has. One that came with a login cookie
        (a browser) keeps jupyter_server's check."""
        if getattr(self, "_jupyter_current_user", True) is None:  # resolved: nobody
            raise self.token_refused()
        super().check_xsrf_cookie()

    def get_login_url(self) -> str:
        """A GET or HEAD without a valid token: ``@web.authenticated`` asks for
        a login page, which an API answers with ``token_needed`` (same 403)."""
        if not self.current_user:
            raise self.token_refused()
        return super().get_login_url()

    def token_refused(self) -> web.HTTPError:
        """The error of a request without a valid token (a flavour may say it its way)."""
        return token_needed()

    def api_key_as_bearer(self) -> None:
        """A token in ``api_key_header`` goes to jupyter_server as a bearer
        token when no Authorization header came, so that its identity
        provider (and its constant-time compare, or the Hub's check) decides."""
        key = self.request.headers.get(self.api_key_header or "")
        if key and "Authorization" not in self.request.headers:
            self.request.headers["Authorization"] = f"Bearer {key}"

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
        if self.api_key_header:
            self.api_key_as_bearer()
        await super().prepare()
        ROUTE.set(self.route_label())  # requests are counted by route (jupyter_llm.metrics)
        ORIGIN.set(checked(parse_origin, self.request.headers.get))  # kernel and cell (usage)
        self._chunks = []
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise web.HTTPError(413, f"request body is larger than {self.max_body} bytes")
        self.request.connection.set_max_body_size(self.max_body + 1)  # type: ignore[attr-defined]

    def route_label(self) -> str:
        """The route as the handler table names it (``api/chat``), its
        arguments as ``{}``: bounded by the table, whatever the path."""
        base, path = unquote(self.settings.get("base_url", "/")), unquote(self.request.path)
        path = path[len(base) :] if path.startswith(base) else ""
        path = path.removeprefix("llm/")
        for arg in self.path_args:
            path = path.replace(arg, "{}", 1) if arg else path
        return path

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._received > self.max_body or self._over_share:
            return
        if not self.held_bodies.take(self.requester.name, len(chunk)):
            self._over_share = True  # read_json refuses it; nothing more is kept
            return
        self._held += len(chunk)
        self._chunks.append(chunk)

    @property
    def held_bodies(self) -> HeldBodies:
        """The server's one account of the bodies its users' requests hold."""
        return self.settings.setdefault(HELD_BODIES, HeldBodies())

    def on_finish(self) -> None:
        self._give_back_body()
        super().on_finish()

    def _body_arrived(self) -> bool:
        """Has the whole body come (the method may be running on it)?"""
        body = getattr(self.request, "_body_future", None)  # tornado's, for streamed bodies
        return body is None or body.done()

    def _give_back_body(self) -> None:
        if self._held:
            self.held_bodies.give(self.requester.name, self._held)
            self._held = 0

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
        if self._over_share:
            raise self.held_bodies.refusal(self.requester.name)
        data, self._chunks = b"".join(self._chunks), []  # not held twice while it is parsed
        return parse_json_object(data)

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

    async def write_answer(self, value: Any) -> None:
        """``write_json`` for a value that may be large (a whole completion with
        its logprobs, a stored response): past ``DECODE_ON_LOOP_BYTES`` it is
        encoded off the loop (25 MiB of answer took 0.8 s of the loop every
        request waits on) a ``FLUSH_CHARS`` chunk at a time, each once the one
        before was taken by the client. A whole encoded copy per request was
        held while a client that reads nothing kept its socket open: 20 such
        GETs of a 30 MiB stored response held 1.5 GiB."""
        if small(value, DECODE_ON_LOOP_BYTES):
            self.write_json(value)
            return
        pieces = json_pieces(value)
        self.set_header("Content-Type", "application/json")
        try:
            while chunk := await self.blocking(next_chunk, pieces):
                self.write(chunk)
                await self.flush_or_close()
            await self.finish()
        except StreamClosedError:
            pass  # the client left, or read nothing for STALLED_CLIENT_SECONDS

    async def write_json_pieces(self, pieces: Iterable[str]) -> None:
        """Answer with a large JSON value (``json_pieces``), flushed every
        ``FLUSH_CHARS``: the loop handles one small piece at a time, and a
        slow client holds back the writing rather than piling up the answer
        in memory; one that reads nothing is let go as a stream's is."""
        self.set_header("Content-Type", "application/json")
        pending = 0
        try:
            for piece in pieces:
                self.write(piece)
                pending += len(piece)
                if pending >= FLUSH_CHARS:
                    pending = 0
                    await self.flush_or_close()
            await self.finish()
        except StreamClosedError:
            pass  # the client left, or read nothing for STALLED_CLIENT_SECONDS

    # -- streaming -----------------------------------------------------------------
    async def connected(self, source: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """``source``'s items while the client is still there. However this
        ends (the client left, the consumer stopped, an error), ``source`` is
        closed, which cancels a generation and releases its runner. Use it
        under ``contextlib.aclosing``."""
        try:
            # the first item may wait long (a queue, a load, the prompt): a
            # client that leaves meanwhile withdraws its request at once, rather
            # than keep its place and have its prompt run for no one
            first = asyncio.ensure_future(anext(source))
            gone = asyncio.ensure_future(self.until_gone())
            try:
                await asyncio.wait((first, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not first.done():
                    first.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await first
            if first.cancelled() or self._client_gone:
                return
            try:
                item = first.result()
            except StopAsyncIteration:
                return
            yield item
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
                    await self._write_values(values, framing)
        except StreamClosedError:
            return  # the client left while we wrote: batches are closed already
        except Exception as e:
            if not begun:
                raise
            status, message = self._error_of(e)
            if status >= 500 and not isinstance(e, LLMError):
                log.exception("%s %s failed mid-stream", self.request.method, self.request.path)
            self.write(framing.encode(self.error_value(status, message)))
        if self._client_gone:
            return
        if not begun:
            self._begin(framing)
        self.write(framing.trailer)
        self.finish()

    async def _write_values(self, values: list[Any], framing: Framing) -> None:
        """A batch of a stream's values, flushed every ``FLUSH_CHARS``; a
        large one (a generation's context: 1.4M token ids took 147 ms to
        encode) is encoded off the loop a piece at a time. A client that
        paused a stream with logprobs gets its backlog as one batch, whose
        encoding held the loop for a second."""
        pending: list[str] = []
        size = 0
        for value in values:
            if small(value, DECODE_ON_LOOP_BYTES):
                text = framing.encode(value)
            else:
                text = await self.blocking(framing.encode_in_pieces, value)
            pending.append(text)
            size += len(text)
            if size >= FLUSH_CHARS:
                self.write("".join(pending))
                pending, size = [], 0
                await self.flush_or_close()
        if pending:
            self.write("".join(pending))
        await self.flush_or_close()

    async def flush_or_close(self) -> None:
        """``flush``, unless the client reads nothing for ``STALLED_CLIENT_SECONDS``:
        then the connection is closed as if the client had left."""
        flushed = self.flush()
        if flushed.done():  # as a rule: the socket took it (no timer per token)
            return await flushed
        try:
            await asyncio.wait_for(flushed, STALLED_CLIENT_SECONDS)
        except TimeoutError:
            log.warning(
                "%s %s: the client read nothing for %g s; its stream is closed",
                self.request.method, self.request.path, STALLED_CLIENT_SECONDS,
            )  # fmt: skip
            self._client_gone = True
            self.request.connection.close()
            raise StreamClosedError() from None

    async def stream_generation(
        self,
        request: GenerationRequest,
        encode: Callable[[list[Event]], list[Any]],
        framing: Framing,
    ) -> None:
        """Stream a completion, each batch of its events as ``encode`` (an
        API's encoder) shapes it."""
        self.resolve_priority(request)  # a bad header is a 400 before any byte

        async def values() -> AsyncGenerator[list[Any], None]:
            async with aclosing(complete(self.llm, request, self.requester)) as batches:
                async for batch in batches:
                    yield encode(batch)

        await self.stream(values(), framing)

    async def whole_completion(self, request: GenerationRequest) -> Reply | None:
        """A completion not streamed: its text and last event, or ``None`` if
        the client left (which cancelled the generation)."""
        self.resolve_priority(request)
        request.whole = True
        generation = complete(self.llm, request, self.requester)
        async with aclosing(self.connected(generation)) as batches:
            result = await collect(batches)
        if result is None and not self._client_gone:
            raise LLMError("the runner ended without finishing")
        return result

    def resolve_priority(self, request: GenerationRequest) -> None:
        """The body's priority, else the ``X-LLM-Priority`` header's
        (``request.priority``); an unknown value is a 400 in this API's shape."""
        header = self.request.headers.get(PRIORITY_HEADER)
        request.priority = checked(resolve_priority, request.priority, header)

    def _begin(self, framing: Framing) -> None:
        self.set_header("Content-Type", framing.content_type)
        for name, value in framing.headers.items():
            self.set_header(name, value)

    # -- errors --------------------------------------------------------------------
    def error_body(self, status: int, message: str) -> Any:
        """The value of ``"error"`` in an error response: Ollama's is the message."""
        return message

    def error_value(self, status: int, message: str) -> Any:
        """The whole error response (and a stream's error value)."""
        return {"error": self.error_body(status, message)}

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
        self.finish(json.dumps(self.error_value(status_code, message)))

    def allowed_methods(self) -> list[str]:
        """The methods this route answers (a forwarded route: its engine's)."""
        handler = getattr(self, "stands_for", type(self))
        return [m for m in HTTP_METHODS if hasattr(getattr(handler, m.lower(), None), "llm_action")]

    def _error_of(self, exc: BaseException | None, status: int = 500) -> tuple[int, str]:
        """The status and the message a client reads for ``exc``, never a traceback."""
        if isinstance(exc, LLMError):
            return exc.status, str(exc)
        if isinstance(exc, web.HTTPError):
            return exc.status_code, http_error_message(exc, self._reason)
        if status >= 500:
            return status, f"internal error: {type(exc).__name__}" if exc else self._reason
        return status, self._reason


def http_error_message(exc: web.HTTPError, reason: str) -> str:
    """What a client reads for tornado's ``exc``: its formatted log message,
    else its reason, else ``reason`` (the status's)."""
    message = exc.log_message or exc.reason or reason
    if exc.args and exc.log_message and "%" in exc.log_message:
        message = exc.log_message % exc.args
    return message
