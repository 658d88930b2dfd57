"""Ollama-compatible handlers under ``{base_url}llm/api/``.

The handlers parse, call and write: bodies become a generation request, and
generations Ollama's values, in ``api/ollama_shapes.py``; streaming (headers,
a client gone, in-stream errors) lives in ``LLMHandler.stream``.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import asdict
from functools import partial
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler
from tornado import web

from jupyter_llm import __version__
from jupyter_llm.api.base import (
    COMPACT,
    LLM,
    LLM_MODELS,
    NDJSON,
    LLMHandler,
    authorized,
    authorized_in_prepare,
    json_pieces,
)
from jupyter_llm.api.generation import GenerationRequest, embed, load_only, unload
from jupyter_llm.api.ollama_shapes import (
    ChatEncoder,
    CreateCall,
    GenerateEncoder,
    OllamaCall,
    OllamaEncoder,
    ShowRead,
    TagFacts,
    chat_call,
    check_text_layer,
    create_call,
    embed_body,
    embedding_body,
    generate_call,
    model_summary,
    show_body,
    tag_facts,
)
from jupyter_llm.api.ps import ps_body
from jupyter_llm.api.requests import EmbedRequest, typed_field
from jupyter_llm.chat_formats.detect import detect_format, template_format
from jupyter_llm.models.gguf_info import builtin_template, read_metadata, read_model_info
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelEntry, ModelStore, parse_digest
from jupyter_llm.request import helper_process
from jupyter_llm.request.errors import InvalidRequest

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
    """``/api/tags``: each model with its capabilities and lengths, read from
    its files once per manifest digest (``TAG_FACTS``), never on the loop."""

    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        entries = await self.blocking(self.llm.store.list)
        facts = await self.blocking(TAG_FACTS.lookup, entries, TAGS_WAIT)
        self.write_json({"models": [model_summary(e, facts.get(e.digest)) for e in entries]})

    head = get  # a probe: the same status and headers, no body


TAGS_WAIT = 1.0  # seconds a listing waits for the files it asked to be read
TAG_FACTS_LIMIT = 4096  # manifests whose facts are kept (each a few hundred bytes)


def read_tag_facts(entry: ModelEntry) -> TagFacts:
    """A model's ``/api/tags`` facts, read as ``/api/show`` reads them. Blocking."""
    read = read_model(entry, verbose=False, projector=False)
    return tag_facts(read.info, read.chat_format, entry.vision)


class TagFactsCache:
    """``/api/tags``' facts per manifest digest, read by one background thread.

    A manifest's digest names every blob the facts come from, so they never
    go stale, and a copied model shares them (as ``template_format``'s cache
    is kept per template digest). A listing asks for the digests it has not
    seen and waits up to ``seconds`` for those: with hundreds of new models
    (a 262k-token vocabulary takes 0.1 s to skip) it answers with the ones
    read by then, and the rest follow in a later listing; a listing never
    waits on what another one asked for. A file the server refuses is listed
    without facts, as Ollama does; one that could not be opened is read again
    next time. At most ``limit`` digests are kept, the least recently listed
    forgotten first."""

    def __init__(
        self,
        read: Callable[[ModelEntry], TagFacts] = read_tag_facts,
        limit: int = TAG_FACTS_LIMIT,
    ) -> None:
        self.read = read
        self.limit = limit
        self.facts: OrderedDict[str, TagFacts] = OrderedDict()
        self.pending: dict[str, ModelEntry] = {}  # to be read, in the order asked
        self.changed = threading.Condition()
        self.reading = False  # the reader thread is running

    def lookup(self, entries: list[ModelEntry], seconds: float) -> dict[str, TagFacts]:
        """The facts known for ``entries`` by digest, once the ones this call
        asks for are read or ``seconds`` have passed. Blocking."""
        with self.changed:
            asked = []
            for entry in entries:
                if entry.digest not in self.facts and entry.digest not in self.pending:
                    self.pending[entry.digest] = entry
                    asked.append(entry.digest)
            if self.pending and not self.reading:
                self.reading = True
                threading.Thread(target=self._read_pending, name="llm-tags", daemon=True).start()
            if asked:
                self.changed.wait_for(lambda: not any(d in self.pending for d in asked), seconds)
            found = {}
            for entry in entries:
                if (facts := self.facts.get(entry.digest)) is not None:
                    self.facts.move_to_end(entry.digest)
                    found[entry.digest] = facts
            return found

    def _read_pending(self) -> None:
        while True:
            with self.changed:
                if not self.pending:
                    self.reading = False
                    return
                digest, entry = next(iter(self.pending.items()))
            facts = self._read_one(entry)
            with self.changed:
                del self.pending[digest]
                if facts is not None:
                    self.facts[digest] = facts
                    while len(self.facts) > self.limit:
                        self.facts.popitem(last=False)
                self.changed.notify_all()

    def _read_one(self, entry: ModelEntry) -> TagFacts | None:
        """The facts, empty for a file this server refuses; None (not kept)
        where it could not be read now."""
        try:
            return self.read(entry)
        except InvalidRequest:
            return TagFacts()
        except OSError:
            return None
        except Exception:  # never the end of the reader: the others still get read
            log.exception("reading %s for /api/tags", entry.name.display)
            return None


TAG_FACTS = TagFactsCache()


class PsHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.write_json(ps_body(self.llm.scheduler))

    head = get  # a probe: the same status and headers, no body


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
        # its messages' images are decoded and measured: not on the loop
        call = await self.blocking(create_call, await self.body_json())
        await self.blocking(create_model, self.llm.store, call)
        if call.stream:

            async def statuses() -> AsyncGenerator[list[Any], None]:
                yield [{"status": s} for s in ("parsing GGUF", "writing manifest", "success")]

            await self.stream(statuses(), NDJSON)
        else:
            self.write_json({"status": "success"})


def create_model(store: ModelStore, call: CreateCall) -> None:
    """Write the model ``call`` asks for, its texts checked first."""
    for key, text in call.texts().items():
        check_text_layer(key, text)
    store.create(
        call.name,
        call.files,
        call.template,
        call.system,
        from_model=call.source,
        parameters=call.parameters,
        messages=call.messages,
        license=call.license,
        draft=call.draft,
    )


class PullHandler(LLMHandler):
    """``/api/pull``: progress as NDJSON ``{status, digest, total, completed}``."""

    auth_resource = LLM_MODELS

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        body = await self.body_json()
        source = body.get("model", body.get("name"))
        insecure = typed_field(body, "insecure", bool, "a boolean", False)
        stream = typed_field(body, "stream", bool, "a boolean", True)
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
    """Answers a generation as NDJSON values (or one object with ``stream: false``)."""

    async def answer(self, call: OllamaCall, encoder: OllamaEncoder) -> None:
        request = call.generation
        if call.only_load:
            self.write_json(encoder.loaded(await self.load_or_unload(request)))
        elif call.stream:
            await self.stream_generation(request, encoder.batch, NDJSON)
        elif (reply := await self.whole_completion(request)) is not None:  # None: the client left
            await self.write_answer(encoder.whole(reply, request.logprobs is not None))

    async def load_or_unload(self, request: GenerationRequest) -> str:
        """A request with nothing to generate: the model loaded (kept), or
        unloaded with ``keep_alive`` 0; the ``done_reason`` that says which."""
        if request.keep_alive == 0:
            await unload(self.llm, request.model, self.requester)
            return "unload"
        await load_only(
            self.llm,
            request.model,
            request.options,
            request.keep_alive,
            self.requester,
            route=request.route,
        )
        return "load"


class GenerateHandler(CompletionHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        # a request's template may be as long as the body: rendered off the event loop
        call = await self.blocking(lambda: generate_call(self.read_json()))
        await self.answer(call, GenerateEncoder(call.generation.model.as_written))


class ChatHandler(CompletionHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        call = await self.blocking(lambda: chat_call(self.read_json()))
        await self.answer(call, ChatEncoder(call.generation.model.as_written))


class EmbedHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        req = EmbedRequest.parse(await self.body_json())
        if not req.inputs:
            await load_only(self.llm, req.model, req.options, req.keep_alive, self.requester)
            self.write_json({"model": req.model.as_written, "embeddings": []})
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
        body = embed_body(req.model.as_written, result)  # the vectors never decoded here
        await self.write_json_pieces(json_pieces(body, COMPACT))


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
        await self.write_json_pieces(json_pieces(embedding_body(result), COMPACT))


class ShowHandler(LLMHandler):
    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def post(self) -> None:
        body = await self.body_json()
        name = parse_model_name(body.get("model", body.get("name")))
        verbose = typed_field(body, "verbose", bool, "a boolean", False)
        entry = await self.blocking(self.llm.store.get, name)
        # the files' keys, a template (up to 4 MiB, perhaps hostile) and up to
        # 65,536 tensors read and shaped off the loop; write_answer encodes the
        # answer off it too, a chunk at a time as the client takes them
        body = await self.blocking(lambda: show_body(entry, read_model(entry, verbose)))
        await self.write_answer(body)


def read_model(entry: ModelEntry, verbose: bool, projector: bool = True) -> ShowRead:
    """What ``/api/show`` (and ``/api/tags``, without the ``projector``'s
    keys) read from a model's files: its GGUF's keys and tensor table, read
    once, and the template it chats in. Blocking."""
    info, tensors = read_model_info(entry.model_path, verbose)
    # a GGUF without a template chats in its family's built-in one
    builtin = builtin_template(entry.model_path, info)
    own = str(info.get("tokenizer.chat_template") or "") or (builtin.source if builtin else "")
    projector_info = None
    if projector and entry.projector_path is not None:
        projector_info = read_metadata(entry.projector_path, verbose)
    # a long template (up to 4 MiB, perhaps hostile) is read where it shares
    # no GIL with the loop: seconds of pure Python slowed every request 2-3x
    read_long = partial(helper_process.run, detect_format)
    template = entry.template or own  # a Modelfile's TEMPLATE over the GGUF's
    fmt = template_format(template, read_long)
    name = builtin.name if builtin else None
    return ShowRead(info, template, name, projector_info, fmt, tensors)


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
        try:
            entry = await self.blocking(self.llm.store.get, name)
        except InvalidRequest:  # a manifest the store cannot read: never loaded, still deleted
            pass
        else:
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
