"""The runner process: serves one model (or device discovery) over its socket.

A reader thread receives requests, answering ``health`` and recording
``cancel`` at once, so both work while the main thread is generating. The
main thread counts its steps (prompt chunks, tokens, embeddings) as
``progress``; ``health`` reports it, so the server can tell a busy runner from
a stuck one. When
the server's end of the socket closes, the runner exits: a killed server
never leaves a runner behind.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jupyter_llm.memory.layout import CPU
from jupyter_llm.memory.measured import Sizes, merged
from jupyter_llm.memory.outputs import output_growth
from jupyter_llm.request.priority import BATCH
from jupyter_llm.runner.chat_plan import ChatPlanner
from jupyter_llm.runner.completion import CompletionReplies, error_reply
from jupyter_llm.runner.context_window import num_keep
from jupyter_llm.runner.embed_replies import EmbedReplies
from jupyter_llm.runner.embedding import EmbedJob
from jupyter_llm.runner.protocol import (
    AllocationError,
    Complete,
    Embed,
    EngineError,
    Health,
    InputError,
    LoadParams,
    decode,
    encode,
    fields_of,
    read,
)
from jupyter_llm.runner.sequence import Job

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.vision import ImagePrompt


class RunnerService:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.requests: queue.Queue[dict[str, Any]] = queue.Queue()
        self.cancelled: set[int] = set()
        self.engine: Engine | None = None
        self.planner: ChatPlanner | None = None
        self.busy_with: int | None = None
        self.loaded: Sizes = {}  # what the load allocated, as its reply said
        self.reported: Sizes = {}  # what the server was last told the runner holds
        self.progress = 0  # main-loop steps; written by the main thread only
        self.progress_at = time.monotonic()
        self._send_lock = threading.Lock()

    def beat(self) -> None:
        """The main thread made progress (called between decode steps)."""
        self.progress += 1
        self.progress_at = time.monotonic()

    def health(self) -> dict[str, Any]:
        busy = self.busy_with
        if busy is None and self.engine is not None:
            busy = next(iter(self.engine.active_ids), None)
        stalled_for = time.monotonic() - self.progress_at if busy is not None else 0.0
        health = Health("ok", self.engine is not None, busy, self.progress, stalled_for)
        return fields_of(health)

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        with self._send_lock:
            self.sock.sendall(data)

    # -- reader thread -----------------------------------------------------------------
    def read_requests(self) -> None:
        stream = self.sock.makefile("rb")
        try:
            for line in stream:
                try:
                    message = decode(line)
                except ValueError:
                    continue
                op = message.get("op")
                if op == "cancel":
                    self.cancelled.add(int(message.get("target", -1)))
                elif op == "info":  # free memory, answered even while generating
                    self.send({"id": message.get("id"), "type": "result", **self.op_info(message)})
                elif op == "health":
                    self.send({"id": message.get("id"), "type": "result", **self.health()})
                else:
                    self.requests.put(message)
                    engine = self.engine
                    if op == "complete" and message.get("priority") != BATCH and engine:
                        engine.interrupt.request()  # a batch-only step in flight ends
        except OSError:
            pass
        os._exit(0)  # the server is gone (or closed us): nothing left to serve

    # -- main thread -------------------------------------------------------------------
    def serve(self) -> None:
        """Handle messages as they come; while the engine has sequences, take
        what arrived between two decode steps and step again."""
        threading.Thread(target=self.read_requests, daemon=True, name="requests").start()
        while True:
            busy = self.engine is not None and self.engine.busy
            if self.engine is not None:  # arrivals from here on are read below or cut a step
                self.engine.interrupt.clear()
            try:
                message: dict[str, Any] | None = self.requests.get(block=not busy)
            except queue.Empty:
                message = None
            if message is not None:
                if message.get("op") == "close":
                    break
                self.handle(message)
                continue  # everything that arrived goes in before the next step
            streams = self.engine.streaming
            started = time.perf_counter()
            self.step()
            # then embedding work, within its share of the loop (``runner.embedding``)
            self.engine.embed_turn(time.perf_counter() - started if streams else None)
        if self.engine is not None:
            from jupyter_llm.runner.prompt_disk import save_slots

            save_slots(self.engine)  # long prefixes to disk, if asked (bounded in time)
            self.engine.close()

    def handle(self, message: dict[str, Any]) -> None:
        rid = message.get("id")
        op = message.get("op")
        handler = getattr(self, f"op_{op}", None)
        self.beat()
        self.busy_with = rid
        try:
            if handler is None:
                raise ValueError(f"unknown runner op {op!r}")
            result = handler(message)
            reply = None if result is None else {"type": "result", **result}
        except Exception as e:
            reply = error_reply(op, e)
        # idle before the last reply goes out: whoever reads it sees a free runner
        self.busy_with = None
        self.beat()
        if reply is not None:  # None: a completion, answered when its sequence ends
            self.cancelled.discard(rid)
            self.send({"id": rid, **reply})

    def step(self) -> None:
        """One decode step. A sequence whose own output work fails ends alone
        inside the engine; a failure no sequence owns (a bug) ends the
        completions in flight with it, and the runner goes on serving."""
        try:
            self.engine.step()
        except Exception as e:
            self.engine.fail_all(e)

    def op_info(self, message: dict[str, Any]) -> dict[str, Any]:
        from jupyter_llm.runner.ggml_devices import list_ggml_devices

        return {"devices": list_ggml_devices(), "pid": os.getpid()}

    def op_load(self, message: dict[str, Any]) -> dict[str, Any]:
        from jupyter_llm.runner.cpu_threads import default_threads
        from jupyter_llm.runner.engine import Engine
        from jupyter_llm.runner.llama_backend import allocation_log

        if self.engine is not None:
            raise ValueError("a model is already loaded in this runner")
        params = read(LoadParams, message)
        if params.n_threads <= 0:  # none asked for: the physical cores this process may use
            params = replace(params, n_threads=default_threads(), adapt_threads=True)
        allocation_log.reset()
        last = [-1.0]

        def progress(value: float) -> None:  # feeds the server's load stall timer
            self.beat()
            if value - last[0] >= 0.01 or value >= 1.0:
                last[0] = value
                self.send({"id": message["id"], "type": "progress", "progress": value})

        try:
            self.engine = Engine(params, progress)
        except EngineError as e:
            if allocation_log.failure:  # llama.cpp said why: memory it could not get
                raise AllocationError(f"{e}: {allocation_log.failure}") from e
            raise
        self.engine.beat = self.beat
        # the logits' buffer grows to a step's rows after the load (memory.outputs)
        engine = self.engine
        growth = output_growth(engine.model.n_vocab, engine.n_outputs, len(engine.slots))
        allocation_log.grows(CPU, "graph", growth)
        self.loaded = self.reported = allocation_log.snapshot()
        self.planner = ChatPlanner(self.engine)
        vision = self.engine.model.vision
        return {
            "allocations": self.loaded,
            "n_ctx": self.engine.n_ctx,
            "n_ctx_train": self.engine.model.n_ctx_train,
            "n_batch": self.engine.n_batch,
            "n_seq": self.engine.n_seq,
            "n_threads": params.n_threads,
            "adaptive_threads": self.engine.threads is not None,  # runner.thread_tuning
            "chat_template": self.engine.model.chat_template,
            "supports_insert": self.engine.model.supports_insert,
            "vision": vision is not None and not vision.refusal,
            "kv_cache_fallback": self.engine.kv_fallback,  # why f16: llama.cpp refused the type
        }

    def op_complete(self, message: dict[str, Any]) -> None:
        """Start a completion: its tokens and its sequence go to the engine,
        which streams and answers it between decode steps. A chat is read
        back as the model's format says (``chat_formats``): thinking and
        answer text apart, tool calls as ``tool_calls`` messages."""
        engine, planner = self._engine(), self.planner
        assert planner is not None  # made with the engine
        rid, request = message["id"], read(Complete, message)
        plan = planner.plan(request)
        media = None
        if plan.parts is not None:
            media = self.image_prompt(engine, request, plan.parts)
            tokens = media.tokens
        else:
            tokens = engine.prompt_tokens(
                plan.prompt, request.context, request.suffix, request.truncate
            )
            tokens = engine.fit_prompt(tokens, num_keep(request.options), request.truncate)
        replies = CompletionReplies(
            rid,
            self.send,
            request.stream_interval,
            plan.reader,
            ended=lambda: self.cancelled.discard(rid),
            memory=self.allocations_now,
            with_context=request.with_context,
        )
        job = Job(
            rid=rid,
            tokens=tokens,
            options=request.options,
            emit=replies.emit,
            finish=replies.finish,
            fail=replies.fail,
            cancelled=lambda: rid in self.cancelled,
            grammar=plan.grammar,
            shift=request.shift,
            triggers=plan.triggers,
            preserve=plan.preserve,
            logprobs=logprobs_count(request),
            on_logprob=replies.add_logprob,
            priority=request.priority,
        )
        if media is not None:
            job.images, job.release = media.images, media.close
        try:
            engine.submit(job)
        except Exception:
            job.release()  # no sequence took its images
            raise

    @staticmethod
    def image_prompt(engine: Engine, request: Complete, parts: list[Any]) -> ImagePrompt:
        """The prompt's tokens with its images, fitted to the context."""
        if request.suffix is not None:
            raise InputError("images cannot be used with suffix (fill-in-the-middle)")
        media = engine.model.image_prompt(parts, request.context, engine.n_batch)
        return engine.fit_image_prompt(media, num_keep(request.options), request.truncate)

    def op_embed(self, message: dict[str, Any]) -> None:
        """Start an embed request: the engine tokenizes and embeds its inputs
        a turn at a time between decode steps. Vectors go out as
        ``embedding`` messages of at most ``part_bytes`` of JSON each, every
        vector already the JSON text the response holds (the server writes
        it as it is), then one ``result`` with the count."""
        engine = self._engine()
        rid, request = message["id"], read(Embed, message)
        encoding = request.encoding or "float"
        if encoding not in ("float", "base64"):
            raise InputError('encoding must be "float" or "base64"')
        texts = [str(t) for t in request.inputs]
        replies = EmbedReplies(
            rid,
            self.send,
            int(request.part_bytes),
            len(texts),
            cancelled=lambda: rid in self.cancelled,
            ended=lambda: self.cancelled.discard(rid),
            memory=self.allocations_now,
        )
        engine.embeddings.submit(
            EmbedJob(
                rid=rid,
                texts=texts,
                truncate=bool(request.truncate),
                dimensions=request.dimensions,
                normalize=None if request.normalize is None else bool(request.normalize),
                encoding=encoding,
                emit=replies.emit,
                finish=replies.finish,
                fail=replies.fail,
                cancelled=lambda: rid in self.cancelled,
            )
        )

    def allocations_now(self) -> Sizes | None:
        """What the runner holds now (its load, and what it made since:
        ``Engine.held_beyond_load``), where that changed since the server was
        last told; None otherwise. Sent with a request's end, so the
        scheduler counts what the runner holds."""
        if self.engine is None:
            return None
        now = merged(self.loaded, self.engine.held_beyond_load())
        if now == self.reported:
            return None
        self.reported = now
        return now

    def op_tokenize(self, message: dict[str, Any]) -> dict[str, Any]:
        return {"tokens": self._engine().model.tokenize(str(message.get("text", "")))}

    def _engine(self) -> Engine:
        if self.engine is None:
            raise ValueError("no model is loaded in this runner")
        return self.engine


def logprobs_count(request: Complete) -> int:
    """-1 for no logprobs, else how many alternatives each token reports."""
    if not request.logprobs:
        return -1
    return max(0, min(int(request.top_logprobs or 0), 20))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_llm.runner")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the server")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    RunnerService(sock).serve()
    return 0
