"""Ollama-compatible handlers under ``{base_url}llm/api/``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_llm import __version__
from jupyter_llm.api.base import LLMHandler, now_iso
from jupyter_llm.api.requests import ChatRequest, CompletionRequest, GenerateRequest
from jupyter_llm.errors import InvalidRequest, LLMError
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelEntry, parse_digest
from jupyter_llm.scheduler import Lease

MAX_BLOB_SIZE = 1 << 40  # 1 TiB: blobs stream to disk, so only the disk bounds them


class VersionHandler(LLMHandler):
    @web.authenticated
    async def get(self) -> None:
        self.write_json({"version": __version__})


class DevicesHandler(LLMHandler):
    @web.authenticated
    async def get(self) -> None:
        devices = await self.llm.scheduler.current_devices()
        system = await self.llm.devices.system()
        self.write_json(
            {
                "devices": [d.to_json() for d in devices],
                "system": system.to_json(),
                "simulated": self.llm.devices.simulated,
            }
        )


class TagsHandler(LLMHandler):
    @web.authenticated
    async def get(self) -> None:
        entries = await self.blocking(self.llm.store.list)
        self.write_json({"models": [model_summary(e) for e in entries]})


class PsHandler(LLMHandler):
    @web.authenticated
    async def get(self) -> None:
        scheduler = self.llm.scheduler
        self.write_json({"models": [scheduler.describe(m) for m in scheduler.loaded_models()]})


def model_summary(entry: ModelEntry) -> dict[str, Any]:
    return {
        "name": entry.name.display,
        "model": entry.name.display,
        "modified_at": entry.modified_at.isoformat().replace("+00:00", "Z"),
        "size": entry.size,
        "digest": entry.digest,
        "details": entry.details,
    }


@web.stream_request_body
class BlobHandler(LLMHandler):
    """``HEAD/POST /api/blobs/sha256:<hex>``: the body streams to a temporary file
    while it is hashed; it is kept only if the digest matches."""

    _writer: Any = None

    async def prepare(self) -> None:
        await super().prepare()
        if self.request.method != "POST":
            return
        if self.current_user is None:
            raise web.HTTPError(403)  # never write an unauthenticated body to disk
        parse_digest(self.path_kwargs["digest"])
        self.request.connection.set_max_body_size(MAX_BLOB_SIZE)  # type: ignore[attr-defined]
        self._writer = self.llm.store.blob_writer()

    def data_received(self, chunk: bytes) -> None:
        if self._writer is not None:
            self._writer.write(chunk)

    @web.authenticated
    async def head(self, digest: str) -> None:
        exists = await self.blocking(self.llm.store.has_blob, parse_digest(digest))
        self.set_status(200 if exists else 404)
        self.finish()

    @web.authenticated
    async def post(self, digest: str) -> None:
        writer, self._writer = self._writer, None
        await self.blocking(writer.commit, digest)
        self.set_status(201)
        self.finish()

    def on_finish(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def on_connection_close(self) -> None:
        self.on_finish()
        super().on_connection_close()


class CreateHandler(LLMHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.body_json()
        name = parse_model_name(body.get("model"))
        for key in ("template", "system"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise InvalidRequest(f"{key} must be a string")
        if body.get("files") is None:
            raise InvalidRequest("files is required: upload a GGUF with /api/blobs first")
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise InvalidRequest("stream must be a boolean")
        store = self.llm.store
        await self.blocking(
            lambda: store.create(name, body["files"], body.get("template"), body.get("system"))
        )
        if stream:
            self.set_header("Content-Type", "application/x-ndjson")
            for status in ("parsing GGUF", "writing manifest", "success"):
                self.write(json.dumps({"status": status}) + "\n")
            self.finish()
        else:
            self.write_json({"status": "success"})


class CompletionHandler(LLMHandler):
    """Shared streaming machinery of generate and chat."""

    _client_gone = False

    def on_connection_close(self) -> None:
        self._client_gone = True
        super().on_connection_close()

    async def _run(
        self,
        req: CompletionRequest,
        runner_request: dict[str, Any],
        empty: bool,
        chunk: Callable[[str], dict[str, Any]],
    ) -> None:
        started = time.perf_counter_ns()
        entry = await self.blocking(self.llm.store.get, req.model)
        scheduler = self.llm.scheduler
        if empty and req.keep_alive == 0:
            await scheduler.unload(entry.name.display)
            self.write_json({**chunk(""), "done": True, "done_reason": "unload"})
            return
        async with scheduler.use(entry, req.load_options, req.keep_alive) as lease:
            if empty:
                final = {**chunk(""), "done": True, "done_reason": "load"}
                self.write_json(final)
                return
            await self._complete(req, lease, runner_request, chunk, started)

    async def _complete(
        self,
        req: CompletionRequest,
        lease: Lease,
        runner_request: dict[str, Any],
        chunk: Callable[[str], dict[str, Any]],
        started: int,
    ) -> None:
        stream = lease.runner.complete(**runner_request, options=req.sampling)
        parts: list[str] = []
        begun = False
        try:
            async for batch in stream:
                lines = []
                for message in batch:
                    if message["type"] == "token":
                        if req.stream:
                            lines.append(json.dumps({**chunk(message["text"]), "done": False}))
                        else:
                            parts.append(message["text"])
                    elif message["type"] == "done":
                        final = {
                            **chunk("" if req.stream else "".join(parts)),
                            **done_fields(message, lease.load_duration_ns, started),
                        }
                        lines.append(json.dumps(final))
                if not req.stream:
                    continue
                if self._client_gone:
                    return
                if not begun:
                    self.set_header("Content-Type", "application/x-ndjson")
                    begun = True
                self.write("\n".join(lines) + "\n")
                await self.flush()
        except StreamClosedError:
            return  # the client left: closing the stream cancels the generation
        except LLMError as e:
            if not begun:
                raise
            self.write(json.dumps({"error": str(e)}) + "\n")
        finally:
            await stream.aclose()
        if req.stream:
            self.finish()
        else:
            self.write_json(json.loads(lines[-1]))


def done_fields(message: dict[str, Any], load_ns: int, started: int) -> dict[str, Any]:
    return {
        "done": True,
        "done_reason": message.get("done_reason", "stop"),
        "total_duration": time.perf_counter_ns() - started,
        "load_duration": load_ns,
        "prompt_eval_count": message.get("prompt_eval_count", 0),
        "prompt_eval_duration": message.get("prompt_eval_duration", 0),
        "eval_count": message.get("eval_count", 0),
        "eval_duration": message.get("eval_duration", 0),
    }


class GenerateHandler(CompletionHandler):
    @web.authenticated
    async def post(self) -> None:
        req = GenerateRequest.parse(self.body_json())
        name = req.model.display
        if req.raw:
            runner_request: dict[str, Any] = {"prompt": req.prompt}
        else:
            messages = []
            if req.system:
                messages.append({"role": "system", "content": req.system})
            messages.append({"role": "user", "content": req.prompt})
            runner_request = {"messages": messages}

        def chunk(text: str) -> dict[str, Any]:
            return {"model": name, "created_at": now_iso(), "response": text}

        await self._run(req, runner_request, not req.prompt, chunk)


class ChatHandler(CompletionHandler):
    @web.authenticated
    async def post(self) -> None:
        req = ChatRequest.parse(self.body_json())
        name = req.model.display

        def chunk(text: str) -> dict[str, Any]:
            return {
                "model": name,
                "created_at": now_iso(),
                "message": {"role": "assistant", "content": text},
            }

        request = {"messages": req.messages, "tools": req.tools}
        await self._run(req, request, not req.messages, chunk)


def handlers() -> list[tuple[str, type[LLMHandler]]]:
    """Routes relative to ``{base_url}llm/``."""
    return [
        (r"api/version", VersionHandler),
        (r"api/devices", DevicesHandler),
        (r"api/tags", TagsHandler),
        (r"api/ps", PsHandler),
        (r"api/blobs/(?P<digest>[^/]+)", BlobHandler),
        (r"api/create", CreateHandler),
        (r"api/generate", GenerateHandler),
        (r"api/chat", ChatHandler),
    ]
