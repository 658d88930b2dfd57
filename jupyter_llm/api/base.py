"""Handler base: Jupyter auth, JSON in, ``{"error": ...}`` out, never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from jupyter_server.base.handlers import APIHandler
from tornado import web

from jupyter_llm.api.requests import parse_json_object
from jupyter_llm.errors import LLMError

log = logging.getLogger(__name__)
T = TypeVar("T")


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


MAX_JSON_BODY = 32 << 20  # 32 MiB: far above any real prompt, far below memory trouble


@web.stream_request_body
class LLMHandler(APIHandler):
    """Base for every jupyter-llm handler (all of them ``@web.authenticated``).

    Bodies are received in chunks and bounded (413 beyond ``max_body``), so a
    huge request is refused without being held in memory.
    """

    max_body = MAX_JSON_BODY
    _chunks: list[bytes]
    _received = 0
    _client_gone = False  # streaming handlers stop (and cancel) once this is set

    def on_connection_close(self) -> None:
        self._client_gone = True
        super().on_connection_close()

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
    def llm(self) -> Any:
        """The extension's services (``LLMExtension``), set in the tornado settings."""
        return self.settings["jupyter_llm"]

    def body_json(self) -> dict[str, Any]:
        if self._received > self.max_body:
            raise web.HTTPError(413, f"request body is larger than {self.max_body} bytes")
        return parse_json_object(b"".join(self._chunks))

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run file-system work off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(value))

    # -- errors --------------------------------------------------------------------
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
        if isinstance(exc, LLMError):
            message = str(exc)
        elif isinstance(exc, web.HTTPError):
            message = exc.log_message or exc.reason or self._reason
            if exc.args and exc.log_message and "%" in exc.log_message:
                message = exc.log_message % exc.args
        elif status_code >= 500:
            message = f"internal error: {type(exc).__name__}" if exc else self._reason
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))
