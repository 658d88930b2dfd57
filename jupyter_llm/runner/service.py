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
import contextlib
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_llm.chat_formats import (
    ChatFormat,
    OutputDelta,
    OutputStream,
    detect_format,
    place_images,
    prompt_opens_thinking,
    template_messages,
    template_variables,
)
from jupyter_llm.chat_formats.detect import check_think
from jupyter_llm.chat_formats.tool_grammar import (
    call_syntax,
    format_markers,
    resolve_tool_choice,
    tool_grammar,
    tool_names,
)
from jupyter_llm.runner.constrained import Triggers
from jupyter_llm.runner.context_window import fit_history, num_keep
from jupyter_llm.runner.embedding import EmbedJob
from jupyter_llm.runner.protocol import (
    ALLOCATION,
    INVALID,
    AllocationError,
    EngineError,
    InputError,
    decode,
    encode,
)
from jupyter_llm.runner.sequence import Job
from jupyter_llm.runner.vision import (
    Part,
    chat_markers,
    decode_images,
    split_chat,
    split_plain,
)

DEFAULT_PART_BYTES = 64 << 10  # JSON of one embedding message, unless the server says


# Characters of one token message: even escaped (6 bytes a character at most)
# its line stays far below the server's limit on a reply line (64 MiB).
PART_CHARS = 1 << 20


class TokenStream:
    """Sends generated text at most every ``interval`` seconds (the first piece
    at once). A slow model's tokens go out one by one; a fast model's are
    grouped, so the server and the client wake up less often and take less CPU
    from the decode threads. Text is never held longer than one token's time
    past the interval. Answer text and thinking are grouped apart: ``send``
    gets ``(text)``, or ``(text, thinking)`` once thinking was added."""

    def __init__(
        self,
        send: Callable[..., None],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._interval = interval
        self._clock = clock
        self._parts: list[str] = []
        self._thinking: list[str] = []
        self._last = -interval

    def add(self, text: str, thinking: str = "") -> None:
        if text:
            self._parts.append(text)
        if thinking:
            self._thinking.append(thinking)
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            self.flush()

    def flush(self) -> None:
        text, thinking = "".join(self._parts), "".join(self._thinking)
        self._parts.clear()  # first: text that cannot be sent is not tried again
        self._thinking.clear()
        # text held back long (an unclosed call read as content at the end) goes in
        # parts: one reply line over the server's limit would end the whole runner
        for at in range(0, max(len(text), len(thinking)), PART_CHARS):
            part, more = text[at : at + PART_CHARS], thinking[at : at + PART_CHARS]
            if more:
                self._send(part, more)
            else:
                self._send(part)


class RunnerService:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.requests: queue.Queue[dict[str, Any]] = queue.Queue()
        self.cancelled: set[int] = set()
        self.engine: Any = None
        self.busy_with: int | None = None
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
        return {
            "status": "ok",
            "loaded": self.engine is not None,
            "busy": busy,
            "progress": self.progress,
            "stalled_for": time.monotonic() - self.progress_at if busy is not None else 0.0,
        }

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
        from jupyter_llm.runner.engine import Engine, LoadParams
        from jupyter_llm.runner.llama_backend import allocation_log

        if self.engine is not None:
            raise ValueError("a model is already loaded in this runner")
        fields = LoadParams.__dataclass_fields__
        allocation_log.reset()
        last = [-1.0]

        def progress(value: float) -> None:  # feeds the server's load stall timer
            self.beat()
            if value - last[0] >= 0.01 or value >= 1.0:
                last[0] = value
                self.send({"id": message["id"], "type": "progress", "progress": value})

        params = LoadParams(**{k: v for k, v in message.items() if k in fields})
        if params.n_threads <= 0:  # none asked for: the physical cores this process may use
            params.n_threads = default_threads()
        try:
            self.engine = Engine(params, progress)
        except EngineError as e:
            if allocation_log.failure:  # llama.cpp said why: memory it could not get
                raise AllocationError(f"{e}: {allocation_log.failure}") from e
            raise
        self.engine.beat = self.beat
        vision = self.engine.model.vision
        return {
            "allocations": allocation_log.devices,
            "n_ctx": self.engine.n_ctx,
            "n_ctx_train": self.engine.model.n_ctx_train,
            "n_batch": self.engine.n_batch,
            "n_seq": self.engine.n_seq,
            "n_threads": params.n_threads,
            "chat_template": self.engine.model.chat_template,
            "supports_insert": self.engine.model.supports_insert,
            "vision": vision is not None and not vision.refusal,
        }

    def op_complete(self, message: dict[str, Any]) -> None:
        """Start a completion: its tokens and its sequence go to the engine,
        which streams and answers it between decode steps. A chat is read
        back as the model's format says (``chat_formats``): thinking and
        answer text apart, tool calls as ``tool_calls`` messages."""
        engine = self._engine()
        rid = message["id"]
        options = message.get("options") or {}
        truncate = bool(message.get("truncate", True))
        plan = plan_chat(engine, message, truncate)
        media = None
        if plan.parts is not None:
            if message.get("suffix") is not None:
                raise InputError("images cannot be used with suffix (fill-in-the-middle)")
            media = engine.model.image_prompt(plan.parts, message.get("context"), engine.n_batch)
            media = engine.fit_image_prompt(media, num_keep(options), truncate)
            tokens = media.tokens
        else:
            tokens = engine.model.prompt_tokens(
                plan.prompt, message.get("context"), message.get("suffix")
            )
            tokens = engine.fit_prompt(tokens, num_keep(options), truncate)

        logprobs: list[dict[str, Any]] = []  # entries not sent yet: they go with the next text

        def send_tokens(text: str, thinking: str = "") -> None:
            reply: dict[str, Any] = {"id": rid, "type": "token", "text": text}
            if thinking:
                reply["thinking"] = thinking
            if logprobs:
                reply["logprobs"] = logprobs[:]
                logprobs.clear()
            self.send(reply)

        out = TokenStream(send_tokens, float(message.get("stream_interval", 0.1)))
        calls = [0]

        def deliver(delta: OutputDelta) -> None:
            if delta.content or delta.thinking:
                out.add(delta.content, delta.thinking)
            if delta.tool_calls:
                out.flush()  # the text before the calls goes first
                calls[0] += len(delta.tool_calls)
                self.send(
                    {
                        "id": rid,
                        "type": "tool_calls",
                        "tool_calls": [
                            {"id": c.id, "name": c.name, "arguments": c.arguments}
                            for c in delta.tool_calls
                        ],
                    }
                )

        reader = plan.reader
        emit = out.add if reader is None else (lambda text: deliver(read_output(reader.feed, text)))

        def finish(result: Any) -> None:
            if reader is not None:
                # at the token limit a call not closed is dropped, not sent as content
                cut_off = result.done_reason == "length"
                deliver(read_output(lambda: reader.finish(cut_off)))
            out.flush()
            if logprobs:  # tokens whose text never went out (a stop string)
                send_tokens("")
            self.cancelled.discard(rid)
            self.send({"id": rid, **result.__dict__, "type": "done", "tool_calls_count": calls[0]})

        def fail(error: Exception) -> None:
            with contextlib.suppress(Exception):  # the text before, unless it is what failed
                out.flush()
            self.cancelled.discard(rid)
            self.send({"id": rid, **error_reply("complete", error)})

        job = Job(
            rid=rid,
            tokens=tokens,
            options=options,
            emit=emit,
            finish=finish,
            fail=fail,
            cancelled=lambda: rid in self.cancelled,
            grammar=plan.grammar,
            shift=bool(message.get("shift", True)),
            triggers=plan.triggers,
            preserve=plan.preserve,
            logprobs=logprobs_count(message),
            on_logprob=logprobs.append,
        )
        if media is not None:
            job.images, job.release = media.images, media.close
        try:
            engine.submit(job)
        except Exception:
            job.release()  # no sequence took its images
            raise
        return None

    def op_embed(self, message: dict[str, Any]) -> None:
        """Start an embed request: the engine tokenizes and embeds its inputs
        a turn at a time between decode steps. Vectors go out as
        ``embedding`` messages of at most ``part_bytes`` of JSON each, every
        vector already the JSON text the response holds (the server writes
        it as it is), then one ``result`` with the count."""
        engine = self._engine()
        rid = message["id"]
        encoding = message.get("encoding") or "float"
        if encoding not in ("float", "base64"):
            raise InputError('encoding must be "float" or "base64"')
        texts = [str(t) for t in message.get("inputs", [])]
        part_bytes = int(message.get("part_bytes") or DEFAULT_PART_BYTES)
        part: list[str] = []
        size = [0]

        def flush() -> None:
            if part:
                self.send({"id": rid, "type": "embedding", "vectors": part[:]})
                part.clear()
                size[0] = 0

        def emit(vectors: list[str]) -> None:
            for vector in vectors:
                if part and size[0] + len(vector) > part_bytes:
                    flush()
                part.append(vector)
                size[0] += len(vector) + 3

        def finish(count: int) -> None:
            flush()
            self.cancelled.discard(rid)
            self.send(
                {"id": rid, "type": "result", "prompt_eval_count": count, "count": len(texts)}
            )

        def fail(error: Exception) -> None:
            if rid in self.cancelled:  # nobody waits for it: no traceback either
                reply: dict[str, Any] = {"type": "error", "error": "cancelled"}
            else:
                reply = error_reply("embed", error)
            self.cancelled.discard(rid)
            self.send({"id": rid, **reply})

        engine.embeddings.submit(
            EmbedJob(
                rid=rid,
                texts=texts,
                truncate=bool(message.get("truncate", True)),
                dimensions=message.get("dimensions"),
                normalize=_normalize_flag(message.get("normalize", True)),
                encoding=encoding,
                emit=emit,
                finish=finish,
                fail=fail,
                cancelled=lambda: rid in self.cancelled,
            )
        )
        return None

    def op_tokenize(self, message: dict[str, Any]) -> dict[str, Any]:
        return {"tokens": self._engine().model.tokenize(str(message.get("text", "")))}

    def _engine(self) -> Any:
        if self.engine is None:
            raise ValueError("no model is loaded in this runner")
        return self.engine


def chat_prompt(
    engine: Any,
    messages: list[dict[str, Any]],
    tools: Any,
    truncate: bool,
    variables: dict[str, Any] | None = None,
) -> str:
    """The chat rendered by the model's template; with ``truncate``, a history
    too long for the context loses whole messages, oldest first, keeping the
    system prompt(s) and the latest message."""

    def render(kept: list[dict[str, Any]]) -> str:
        return engine.model.render_chat(kept, tools, variables)

    if truncate:
        messages = fit_history(messages, lambda kept: engine.fits(render(kept)))
    return render(messages)


@dataclass(frozen=True)
class ChatSetup:
    """What one model's chat template says, worked out once per engine."""

    fmt: ChatFormat
    syntax: str  # the tool-call syntax grammars hold calls to (``call_syntax``)
    preserve: frozenset[int]  # its markers that are single control tokens


def chat_setup(engine: Any) -> ChatSetup:
    setup = getattr(engine, "chat_setup", None)
    if setup is None:
        template = engine.model.chat_template or ""
        fmt = detect_format(template)
        setup = ChatSetup(
            fmt=fmt,
            syntax=call_syntax(fmt, template),
            preserve=engine.model.control_tokens(format_markers(fmt)),
        )
        engine.chat_setup = setup
    return setup


@dataclass(frozen=True)
class ChatPlan:
    """A completion's prompt, grammar and output reader."""

    prompt: str
    grammar: str | None = None
    triggers: Triggers | None = None
    preserve: frozenset[int] = frozenset()
    reader: OutputStream | None = None
    parts: list[Part] | None = None  # the prompt as text and images, when it has images


def plan_chat(engine: Any, message: dict[str, Any], truncate: bool) -> ChatPlan:
    """The prompt (a chat rendered with its tools and thinking variables, or
    the prompt as given), the grammar (the request's ``grammar``, or the
    tool-call grammar) and how the output is read back. ``InputError`` for
    a request the model cannot honour."""
    tools = message.get("tools") or None
    think = message.get("think")
    grammar = message.get("grammar")
    is_chat = message.get("messages") is not None
    plain_images = decode_images(message.get("images"))
    if plain_images and is_chat:
        raise InputError("a chat's images go in its messages, not beside them")
    if not is_chat and tools is None and think is None:
        prompt = str(message.get("prompt", ""))
        return ChatPlan(
            prompt=prompt, grammar=grammar, parts=plain_parts(engine, prompt, plain_images)
        )
    setup = chat_setup(engine)
    fmt = setup.fmt
    name = message.get("model")
    model = f'"{name}"' if name else "this model"
    if tools and not fmt.accepts_tools:
        raise InputError(f"{model} does not support tools")
    try:
        check_think(think)  # before "does not support thinking", which would hide it
    except ValueError as e:
        raise InputError(str(e)) from None
    if think not in (None, False) and not fmt.can_think:
        raise InputError(f"{model} does not support thinking")
    try:
        choice = resolve_tool_choice(message.get("tool_choice"), tools)
        variables = template_variables(fmt, think)
        marker = chat_markers()
        images: list[bytes] = []
        if is_chat:
            messages, images = place_images(chat_images(message["messages"]), marker)
            messages = template_messages(messages, fmt)
    except ValueError as e:
        raise InputError(str(e)) from None
    if images:
        engine.model.image_marker  # noqa: B018 - a model without a projector refuses before rendering
    if is_chat:
        prompt = chat_prompt(engine, messages, tools, truncate, variables)
        parts = split_chat(prompt, marker, images) if images else None
    else:
        prompt = str(message.get("prompt", ""))
        parts = plain_parts(engine, prompt, plain_images)
    starts_in_thinking = prompt_opens_thinking(prompt, fmt)
    triggers = None
    constrained = False  # a tool-call grammar holds the output
    if tools and choice != "none" and not (grammar and choice == "auto"):
        # a required call wins over a format; with "auto" the format holds
        built = tool_grammar(
            fmt,
            tools,
            choice,
            syntax=setup.syntax,
            starts_in_thinking=starts_in_thinking,
            may_think=think is not False,
            parallel=bool(message.get("parallel_tool_calls", False)),
        )
        if built is not None:
            grammar, constrained = built.grammar, True
            if built.lazy:
                words = sorted(engine.model.control_tokens(built.trigger_words))
                triggers = Triggers(patterns=built.trigger_patterns, tokens=tuple(words))
    reader = None
    if tools or fmt.can_think:
        reader = OutputStream(
            fmt,
            tools=bool(tools),
            starts_in_thinking=starts_in_thinking,
            split_thinking=fmt.can_think,
            tool_names=tool_names(tools),
            constrained=constrained,
        )
    preserve = setup.preserve if reader else frozenset()
    return ChatPlan(prompt, grammar, triggers, preserve, reader, parts)


def chat_images(messages: Any) -> list[dict[str, Any]]:
    """The chat with each message's ``images`` decoded (base64 → bytes)."""
    out = []
    for i, message in enumerate(list(messages)):
        if isinstance(message, dict) and message.get("images"):
            message = {
                **message,
                "images": decode_images(message["images"], f"messages[{i}].images"),
            }
        out.append(message)
    return out


def plain_parts(engine: Any, prompt: str, images: list[bytes]) -> list[Part] | None:
    """A plain prompt with images as parts (None without images): at its
    markers (mtmd's), else first."""
    if not images:
        return None
    return split_plain(prompt, engine.model.image_marker, images)


def logprobs_count(message: dict[str, Any]) -> int:
    """-1 for no logprobs, else how many alternatives each token reports."""
    value = message.get("logprobs")
    if value is None or value is False:
        return -1
    return max(0, min(int(message.get("top_logprobs") or 0), 20))


class UnreadableOutput(EngineError):
    """The model's output could not be read as its chat format says: that
    request ends with this error; the runner and the other requests go on."""


def read_output(read: Callable[..., OutputDelta], *text: str) -> OutputDelta:
    """A reader's next delta; any failure in it is ``UnreadableOutput``. The
    readers turn what they cannot parse into content, so this is for a bug,
    not for a model: it names what failed rather than killing the runner."""
    try:
        return read(*text)
    except Exception as e:
        trace = "".join(traceback.format_exception(e))
        print(f"runner: a reader failed on the model's output: {trace}", file=sys.stderr)
        raise UnreadableOutput(
            f"the model's output could not be read ({type(e).__name__}: {e})"
        ) from None


def error_reply(op: Any, e: Exception) -> dict[str, Any]:
    """The protocol's error message for ``e``: typed where the server acts on it."""
    if isinstance(e, InputError):
        return {"type": "error", "kind": INVALID, "error": str(e)}
    if isinstance(e, AllocationError):
        return {"type": "error", "kind": ALLOCATION, "error": str(e)}
    if not isinstance(e, UnreadableOutput):  # its reader's failure is logged already
        trace = "".join(traceback.format_exception(e))
        print(f"runner error in {op}: {trace}", file=sys.stderr)
    # whatever the text, it goes out: a lone surrogate would fail the reply's encoding
    text = (str(e) or type(e).__name__).encode("utf-8", "backslashreplace").decode()
    return {"type": "error", "error": text}


def _normalize_flag(value: Any) -> bool | None:
    """``normalize`` of an embed message: true, false, or null for "as
    Ollama's legacy route does for this model" (``Model.legacy_normalizes``)."""
    return None if value is None else bool(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_llm.runner")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the server")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    RunnerService(sock).serve()
    return 0
