"""Ollama-compatible handlers under ``{base_url}llm/api/``.

Streaming (headers, a client gone, in-stream errors) lives in
``LLMHandler.stream``; the handlers here only encode their NDJSON values.
``/api/create`` validates its messages with ``jupyter_llm.messages`` directly.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import asdict
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_llm import __version__
from jupyter_llm.api.base import (
    LLM,
    LLM_MODELS,
    NDJSON,
    LLMHandler,
    authorized,
    authorized_in_prepare,
    now_iso,
)
from jupyter_llm.api.generation import (
    Event,
    Finished,
    Job,
    Logprobs,
    RawJSON,
    Thinking,
    ToolCalls,
    complete,
    embed,
    json_array,
    load_only,
    unload,
    write_json_pieces,
)
from jupyter_llm.api.ps import ps_body
from jupyter_llm.api.requests import (
    ChatRequest,
    CompletionRequest,
    EmbedRequest,
    GenerateRequest,
    checked,
    messages_field,
    options_field,
)
from jupyter_llm.api.templates import render_go_template
from jupyter_llm.chat_formats.detect import template_format
from jupyter_llm.errors import InvalidRequest
from jupyter_llm.limits import TEXT_LAYER
from jupyter_llm.models.gguf_info import builtin_template, read_metadata
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelEntry, parse_digest

log = logging.getLogger(__name__)
MAX_BLOB_SIZE = 1 << 40  # 1 TiB: blobs stream to disk, so only the disk bounds them


class RootHandler(APIHandler):
    """``GET/HEAD {base_url}llm/`` (and ``llm``): Ollama's heartbeat, which
    clients probe before using a server. It answers without a token: it
    tells nothing beyond "this URL is an Ollama-compatible API", like
    jupyter_server's own unauthenticated ``/api``, and a client learns the
    same from any 403. It does not count as activity, so a polling client
    does not keep an idle server alive. Host and origin checks still apply.
    """

    _track_activity = False

    @allow_unauthenticated
    def get(self) -> None:
        self.finish(HEARTBEAT, set_content_type="text/plain; charset=utf-8")

    @allow_unauthenticated
    def head(self) -> None:
        self.get()


HEARTBEAT = "Ollama is running"


class VersionHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.write_json({"version": __version__})

    head = get  # a probe: the same status and headers, no body


class DevicesHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        devices = await self.llm.scheduler.current_devices()
        system = await self.llm.devices.system()
        notices = await self.llm.devices.notices(devices)
        host = await self.llm.devices.host_gpus()
        nodes = await self.llm.devices.nodes()
        self.write_json(
            {
                "devices": [d.to_json() for d in devices],
                # the machines, each with its devices' ids (one without a cluster)
                "nodes": [
                    {**n.to_json(), "devices": [d.id for d in devices if d.node == n.id]}
                    for n in nodes
                ],
                "system": system.to_json(),
                "simulated": self.llm.devices.simulated,
                "notices": [n.to_json() for n in notices],
                "host_gpus": [asdict(g) for g in host],
                "runner": {"python": self.llm.devices.python or sys.executable},
            }
        )

    head = get  # a probe: the same status and headers, no body


class TagsHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        entries = await self.blocking(self.llm.store.list)
        self.write_json({"models": [model_summary(e) for e in entries]})

    head = get  # a probe: the same status and headers, no body


class PsHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.write_json(ps_body(self.llm.scheduler))

    head = get  # a probe: the same status and headers, no body


def model_summary(entry: ModelEntry) -> dict[str, Any]:
    return {
        "name": entry.name.display,
        "model": entry.name.display,
        "modified_at": entry.modified_at.isoformat().replace("+00:00", "Z"),
        "size": entry.size,
        "digest": entry.digest,
        "details": entry.details,
    }


class BlobHandler(LLMHandler):
    """``HEAD/POST /api/blobs/sha256:<hex>``: the body streams to a temporary file
    while it is hashed; it is kept only if the digest matches."""

    auth_resource = LLM_MODELS

    max_body = MAX_BLOB_SIZE
    _writer: Any = None

    async def prepare(self) -> None:
        await super().prepare()
        if self.request.method != "POST":
            return
        if self.current_user is None:
            raise web.HTTPError(403)  # never write an unauthenticated body to disk
        await self.authorize("write")  # nor one this user may not store
        parse_digest(self.path_kwargs["digest"])
        self._writer = self.llm.store.blob_writer()

    def data_received(self, chunk: bytes) -> None:
        if self._writer is not None:
            self._writer.write(chunk)

    @web.authenticated
    @authorized("read")
    async def head(self, digest: str) -> None:
        exists = await self.blocking(self.llm.store.has_blob, parse_digest(digest))
        self.set_status(200 if exists else 404)
        self.finish()

    @web.authenticated
    @authorized_in_prepare("write")  # before the body streams to disk
    async def post(self, digest: str) -> None:
        writer, self._writer = self._writer, None
        # held until its /api/create uses it (an hour at most): no deletion between
        await self.blocking(self.llm.store.commit_upload, writer, digest)
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
    """``/api/create`` from uploaded ``files`` or an existing model (``from``),
    with template, system, parameters, messages and license."""

    auth_resource = LLM_MODELS

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        body = await self.body_json()
        name = parse_model_name(body.get("model"))
        for key in ("template", "system"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise InvalidRequest(f"{key} must be a string")
        source = body.get("from")
        if source is not None:
            source = parse_model_name(source, "from")
        for key, what in (("quantize", "quantizing"), ("adapters", "LoRA adapters")):
            if body.get(key):  # never silently a model other than the one asked for
                raise InvalidRequest(f"{key}: {what} is not supported here")
        if body.get("files") is None and source is None:
            raise InvalidRequest("files is required (upload a GGUF with /api/blobs first), or from")
        parameters = options_field(body.get("parameters"), "parameters")
        messages = None
        if body.get("messages") is not None:
            messages = messages_field(body["messages"])
        license_ = body.get("license")
        if license_ is not None and not (
            isinstance(license_, str)
            or (isinstance(license_, list) and all(isinstance(x, str) for x in license_))
        ):
            raise InvalidRequest("license must be a string or a list of strings")
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise InvalidRequest("stream must be a boolean")
        store = self.llm.store

        def create() -> None:
            texts = {"template": body.get("template"), "system": body.get("system")}
            if isinstance(license_, str):
                texts["license"] = license_
            else:
                texts.update((f"license[{i}]", text) for i, text in enumerate(license_ or []))
            for key, text in texts.items():
                check_text_layer(key, text)
            store.create(
                name,
                body.get("files"),
                body.get("template"),
                body.get("system"),
                from_model=source,
                parameters=parameters,
                messages=messages,
                license=license_,
            )

        await self.blocking(create)
        if stream:

            async def statuses() -> AsyncGenerator[list[Any], None]:
                yield [{"status": s} for s in ("parsing GGUF", "writing manifest", "success")]

            await self.stream(statuses(), NDJSON)
        else:
            self.write_json({"status": "success"})


def check_text_layer(field: str, text: str | None) -> None:
    """``InvalidRequest`` for a text the store would refuse to read back (a
    layer over ``TEXT_LAYER`` bytes), before anything is written."""
    if text is None or len(text) * 4 <= TEXT_LAYER.value:
        return
    checked(TEXT_LAYER.check, field, len(text.encode("utf-8", "surrogatepass")))


class PullHandler(LLMHandler):
    """``/api/pull``: progress as NDJSON ``{status, digest, total, completed}``."""

    auth_resource = LLM_MODELS

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        body = await self.body_json()
        source = body.get("model", body.get("name"))
        insecure = body.get("insecure", False)
        stream = body.get("stream", True)
        for key, value in (("insecure", insecure), ("stream", stream)):
            if not isinstance(value, bool):
                raise InvalidRequest(f"{key} must be a boolean")
        name = body.get("name") if body.get("model") else None
        if name is not None and not isinstance(name, str):
            raise InvalidRequest("name must be a string")
        events = self.llm.puller.pull(source, insecure=insecure, name=name)
        if not stream:  # the download runs to its end even if the client leaves
            async with aclosing(events):  # type: ignore[type-var]
                async for _ in events:
                    pass
            self.write_json({"status": "success"})
            return

        async def progress() -> AsyncGenerator[list[Any], None]:
            async with aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    yield [event]

        # a client that leaves stops only its own progress: the download goes
        # on for anyone else waiting on it
        await self.stream(progress(), NDJSON)


class CompletionHandler(LLMHandler):
    """Streams NDJSON chunks (or one object with ``stream: false``)."""

    async def _respond(
        self,
        req: CompletionRequest,
        job: Job,
        empty: bool,
        chunk: Chunk,
        final_extra: Callable[[Finished], dict[str, Any]] = lambda f: {},
    ) -> None:
        services = self.llm
        if empty:  # load or unload only
            if req.keep_alive == 0:
                await unload(services, req.model, self.requester)
                self.write_json({**chunk(""), "done": True, "done_reason": "unload"})
            else:
                await load_only(services, req.model, req.options, req.keep_alive, self.requester)
                self.write_json({**chunk(""), "done": True, "done_reason": "load"})
            return
        if not req.stream:
            if (reply := await self.whole_completion(job)) is None:
                return  # the client left
            calls = ollama_tool_calls(reply.tool_calls, 0)
            finished = reply.finished
            whole = {
                **chunk(reply.text, reply.thinking, calls),
                **done_fields(finished),
                **final_extra(finished),
            }
            if job.logprobs is not None:
                whole["logprobs"] = reply.logprobs
            self.write_json(whole)
            return
        count = [0]  # tool calls so far: their index

        def value(e: Event) -> dict[str, Any]:
            if isinstance(e, str):
                return {**chunk(e), "done": False}
            if isinstance(e, Thinking):
                return {**chunk("", e.text), "done": False}
            if isinstance(e, ToolCalls):
                calls = ollama_tool_calls(e.calls, count[0])
                count[0] += len(calls)
                return {**chunk("", "", calls), "done": False}
            if isinstance(e, Logprobs):
                return {**chunk(""), "logprobs": e.entries, "done": False}
            return {**chunk(""), **done_fields(e), **final_extra(e)}

        async def ndjson() -> AsyncGenerator[list[dict[str, Any]], None]:
            async with aclosing(complete(services, job, self.requester)) as events:
                async for batch in events:
                    yield [value(e) for e in batch]

        await self.stream(ndjson(), NDJSON)


# a streamed piece: content, thinking, tool calls (Ollama's shape)
Chunk = Callable[..., dict[str, Any]]


def ollama_tool_calls(calls: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """Ollama's ``tool_calls``: ``{"id", "function": {"index", "name", "arguments"}}``."""
    return [
        {
            "id": call.get("id", ""),
            "function": {
                "index": first + i,
                "name": call["name"],
                "arguments": call.get("arguments", {}),
            },
        }
        for i, call in enumerate(calls)
    ]


def message_fields(text: str, thinking: str, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An assistant message's fields, the optional ones only when present."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


def done_fields(f: Finished) -> dict[str, Any]:
    return {
        "done": True,
        "done_reason": f.done_reason,
        "total_duration": f.total_duration,
        "load_duration": f.load_duration,
        "prompt_eval_count": f.prompt_eval_count,
        "prompt_eval_duration": f.prompt_eval_duration,
        "eval_count": f.eval_count,
        "eval_duration": f.eval_duration,
    }


class GenerateHandler(CompletionHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        req = await self.blocking(lambda: GenerateRequest.parse(self.read_json()))
        name = req.model.display
        job = Job(
            model=req.model,
            options=req.options,
            keep_alive=req.keep_alive,
            context=req.context,
            suffix=req.suffix,
            format=req.format,
            think=req.think,
            logprobs=req.logprobs,
            truncate=req.truncate,
            shift=req.shift,
        )
        if req.raw or req.suffix is not None:
            job.prompt, job.images = req.prompt, req.images
        elif req.template is not None:
            values = {"System": req.system or "", "Prompt": req.prompt}  # a request's
            # template may be as long as the body: rendered off the event loop
            job.prompt = await self.blocking(render_go_template, req.template, values)
            job.images = req.images
        else:
            job.messages = []
            if req.system:
                job.messages.append({"role": "system", "content": req.system})
            user: dict[str, Any] = {"role": "user", "content": req.prompt}
            if req.images:
                user["images"] = req.images
            job.messages.append(user)

        def chunk(text: str, thinking: str = "", calls: Any = None) -> dict[str, Any]:
            out = {"model": name, "created_at": now_iso(), "response": text}
            return {**out, "thinking": thinking} if thinking else out

        empty = not req.prompt and not req.images and req.suffix is None
        await self._respond(req, job, empty, chunk, lambda f: {"context": f.context})


class ChatHandler(CompletionHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        req = await self.blocking(lambda: ChatRequest.parse(self.read_json()))
        name = req.model.display
        job = Job(
            model=req.model,
            options=req.options,
            keep_alive=req.keep_alive,
            messages=req.messages,
            tools=req.tools,
            tool_choice=req.tool_choice,
            format=req.format,
            think=req.think,
            logprobs=req.logprobs,
            truncate=req.truncate,
            shift=req.shift,
        )

        def chunk(text: str, thinking: str = "", calls: Any = None) -> dict[str, Any]:
            return {
                "model": name,
                "created_at": now_iso(),
                "message": message_fields(text, thinking, calls),
            }

        await self._respond(req, job, not req.messages, chunk)


class EmbedHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        req = EmbedRequest.parse(await self.body_json())
        if not req.inputs:
            await load_only(self.llm, req.model, req.options, req.keep_alive, self.requester)
            self.write_json({"model": req.model.display, "embeddings": []})
            return
        result = await embed(
            self.llm,
            req.model,
            req.inputs,
            truncate=req.truncate,
            dimensions=req.dimensions,
            options=req.options,
            keep_alive=req.keep_alive,
            requester=self.requester,
        )
        await write_json_pieces(  # the runner's JSON of the vectors, never decoded here
            self,
            {
                "model": req.model.display,
                "embeddings": json_array(result.vectors),
                "total_duration": result.total_duration,
                "load_duration": result.load_duration,
                "prompt_eval_count": result.prompt_eval_count,
            },
        )


class EmbeddingsHandler(LLMHandler):
    """The legacy single-prompt endpoint: vectors normalised or raw as
    Ollama's are for the model (``runner.pooling.legacy_normalizes``)."""

    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        req = EmbedRequest.parse(await self.body_json(), input_field="prompt")
        if not req.inputs or not req.inputs[0]:
            self.write_json({"embedding": []})
            return
        result = await embed(
            self.llm,
            req.model,
            req.inputs[:1],
            normalize=None,
            options=req.options,
            keep_alive=req.keep_alive,
            requester=self.requester,
        )
        await write_json_pieces(self, {"embedding": RawJSON(result.vectors[:1])})


class ShowHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def post(self) -> None:
        body = await self.body_json()
        name = parse_model_name(body.get("model", body.get("name")))
        verbose = body.get("verbose", False)
        if not isinstance(verbose, bool):
            raise InvalidRequest("verbose must be a boolean")
        entry = await self.blocking(self.llm.store.get, name)
        info = await self.blocking(read_metadata, entry.model_path, verbose)
        # a GGUF without a template chats in its family's built-in one: named in details
        builtin = await self.blocking(builtin_template, entry.model_path, info)
        own = str(info.get("tokenizer.chat_template") or "") or (builtin.source if builtin else "")
        template = entry.template or own
        details = {**entry.details, "builtin_template": builtin.name} if builtin else entry.details
        # reading a template (up to 4 MiB, perhaps hostile) is CPU work: off the loop
        capabilities = await self.blocking(model_capabilities, info, template)
        extra: dict[str, Any] = {}
        if entry.projector_path is not None:  # its GGUF's keys, as model_info is the model's
            capabilities.append("vision")
            extra["projector_info"] = await self.blocking(
                read_metadata, entry.projector_path, verbose
            )
        reply = {
            "license": entry.license or "",
            "modelfile": "".join(
                f"FROM {path}\n" for path in (entry.model_path, entry.projector_path) if path
            ),
            "parameters": format_parameters(entry.params),
            "messages": entry.messages,
            "template": template,
            "system": entry.system or "",
            "details": details,
            "model_info": info,
            "capabilities": capabilities,
            "modified_at": entry.modified_at.isoformat().replace("+00:00", "Z"),
            **extra,
        }
        # a 4 MiB template, or a verbose vocabulary, takes a while to encode
        chunks = await self.blocking(json_fairly, reply)
        self.set_header("Content-Type", "application/json")
        self.set_header("Content-Length", sum(map(len, chunks)))
        try:
            for chunk in chunks:  # a piece at a time: no 4 MiB copy on the loop
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            return  # the client left
        self.finish()


def model_capabilities(info: dict[str, Any], template: str) -> list[str]:
    """Ollama's ``capabilities``: a model that declares a pooling type embeds,
    any other completes (never both, as in Ollama's server/images.go). Tools
    and thinking are what ``chat_formats.detect`` reads in the template (once
    per template digest); call this off the event loop."""
    if any(key.endswith(".pooling_type") for key in info):
        capabilities = ["embedding"]
    else:
        capabilities = ["completion"]
        if "tokenizer.ggml.fim_pre_token_id" in info:
            capabilities.append("insert")
    fmt = template_format(template)
    if fmt.offers_tools:
        capabilities.append("tools")
    if fmt.can_think:
        capabilities.append("thinking")
    return capabilities


JSON_PIECE = 1 << 16  # characters, or list items, the C encoder takes in one call


def json_fairly(value: Any) -> list[bytes]:
    """``value`` as JSON (what ``json.dumps`` writes), in chunks of about
    ``JSON_PIECE`` characters, encoded a piece at a time with the GIL handed
    over between pieces. ``json.dumps`` holds the GIL for its whole call,
    10-40 ms for a 4 MiB template or a verbose vocabulary, which stalls the
    event loop even from an executor thread; so does touching a fresh 4 MiB
    buffer, which chunks avoid."""
    pieces: list[str] = []
    _encode_fairly(value, pieces)
    chunks: list[bytes] = []
    group: list[str] = []
    size = 0
    for piece in pieces:
        group.append(piece)
        size += len(piece)
        if size >= JSON_PIECE:
            chunks.append("".join(group).encode())
            group, size = [], 0
    if group or not chunks:
        chunks.append("".join(group).encode())
    return chunks


def _encode_fairly(value: Any, out: list[str]) -> None:
    if isinstance(value, str) and len(value) > JSON_PIECE:
        out.append('"')
        for i in range(0, len(value), JSON_PIECE):  # escapes are per character
            out.append(json.dumps(value[i : i + JSON_PIECE])[1:-1])
            time.sleep(0)  # hand the GIL to the event loop if it waits
        out.append('"')
    elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        sep = "{"
        for key, item in value.items():
            out.append(f"{sep}{json.dumps(key)}: ")
            _encode_fairly(item, out)
            sep = ", "
        out.append("}")
    elif isinstance(value, list | tuple) and len(value) > JSON_PIECE // 16:
        step = JSON_PIECE // 16
        sep = "["
        for i in range(0, len(value), step):
            out.append(sep + json.dumps(list(value[i : i + step]))[1:-1])
            sep = ", "
            time.sleep(0)
        out.append("]")
    else:
        out.append(json.dumps(value))


def format_parameters(params: dict[str, Any]) -> str:
    """Ollama's ``parameters`` text: one ``name value`` line each, lists repeated."""
    lines = []
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{key:<24}{json.dumps(item) if isinstance(item, str) else item}")
    return "\n".join(lines)


class CopyHandler(LLMHandler):
    auth_resource = LLM_MODELS

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        body = await self.body_json()
        source = parse_model_name(body.get("source"), "source")
        destination = parse_model_name(body.get("destination"), "destination")
        await self.blocking(self.llm.store.copy, source, destination)
        self.set_status(200)
        self.finish()


class DeleteHandler(LLMHandler):
    auth_resource = LLM_MODELS

    @web.authenticated
    @authorized("write")
    async def delete(self) -> None:
        body = await self.body_json()
        name = parse_model_name(body.get("model", body.get("name")))
        entry = await self.blocking(self.llm.store.get, name)
        await self.llm.scheduler.unload(entry.name.display, self.requester)
        await self.blocking(self.llm.store.delete, name)
        self.set_status(200)
        self.finish()


def handlers() -> list[tuple[str, type[APIHandler]]]:
    """Routes relative to ``{base_url}llm/`` (``?``: the root, with or without
    its slash)."""
    return [
        (r"?", RootHandler),
        (r"api/version", VersionHandler),
        (r"api/devices", DevicesHandler),
        (r"api/tags", TagsHandler),
        (r"api/ps", PsHandler),
        (r"api/blobs/(?P<digest>[^/]+)", BlobHandler),
        (r"api/create", CreateHandler),
        (r"api/pull", PullHandler),
        (r"api/generate", GenerateHandler),
        (r"api/chat", ChatHandler),
        (r"api/embed", EmbedHandler),
        (r"api/embeddings", EmbeddingsHandler),
        (r"api/show", ShowHandler),
        (r"api/copy", CopyHandler),
        (r"api/delete", DeleteHandler),
    ]
