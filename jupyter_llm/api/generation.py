"""One way to run a completion or an embedding for any API flavour: find the
model, hold a runner through the scheduler, stream what the runner says.

The Ollama and OpenAI handlers translate their bodies into one
``GenerationRequest`` (``api/ollama_shapes.py``, ``api/openai_shapes.py``)
and the events back into their wire formats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from jupyter_llm.api.output_check import check_later
from jupyter_llm.grammar.check import OutputFormat
from jupyter_llm.metrics import Asked, Completion, count_request
from jupyter_llm.models.names import ModelName
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.request.errors import InvalidRequest, RunnerFailed
from jupyter_llm.request.identity import LOCAL, Requester
from jupyter_llm.request.images import check_with_model_images
from jupyter_llm.request.limits import whole_answer_tokens
from jupyter_llm.request.options import sampling_options
from jupyter_llm.request.priority import INTERACTIVE
from jupyter_llm.runner.protocol import (
    Complete,
    Done,
    Embed,
    ProtocolError,
    Token,
    ToolCallsReply,
    read,
)
from jupyter_llm.scheduler import LoadOptions
from jupyter_llm.usage.recording import Held

if TYPE_CHECKING:
    from jupyter_llm.services import LLMServices

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    """One completion as every API asks for it: what ``complete`` runs."""

    model: ModelName
    options: dict[str, Any] = field(default_factory=dict)  # Ollama options
    keep_alive: float | None = None
    prompt: str | None = None  # raw text (with its images), or...
    images: list[str] = field(default_factory=list)  # base64 image files for the prompt
    messages: list[dict[str, Any]] | None = None  # ...chat messages for the template
    tools: list[Any] | None = None
    context: list[int] | None = None  # tokens of an earlier exchange, before the prompt
    suffix: str | None = None  # fill-in-the-middle
    format: OutputFormat | None = None
    think: bool | str | None = None  # None: the template's default
    relax_think: bool = False  # a model that cannot think answers without (Anthropic's route)
    logprobs: int | None = None  # None: none; else alternatives per token
    tool_choice: Any = None  # "auto" | "none" | "required" | {"name": ...}; None: auto
    parallel_tool_calls: bool | None = None  # None: one call (llama.cpp's default)
    truncate: bool = True  # Ollama's request fields: cut an over-long prompt...
    shift: bool = True  # ...and shift a full context
    priority: str | None = None  # "interactive" | "batch"; None: the header's, else interactive
    route: str = "chat"  # or "generate" (a prompt's routes): Ollama's errors name it
    with_context: bool = False  # the answer's tokens back (Ollama's /api/generate ``context``)
    whole: bool = False  # not streamed: the server holds the answer until it ends


@dataclass
class Finished:
    """The last event of a completion (durations in nanoseconds)."""

    done_reason: str
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
    load_duration: int
    total_duration: int
    context: list[int]
    stop_sequence: str = ""  # the stop string that ended it, if one did
    prompt_cached: int = 0  # of prompt_eval_count, the tokens the cache held
    prompt_cache: str = ""  # where those came from: "slot", "disk" (the runner's Done)
    draft_tokens: int = 0  # output tokens drafted by prompt lookup and checked
    draft_accepted: int = 0  # of those, the ones the model confirmed
    thinking_tokens: int = 0  # of eval_count, the tokens whose text was thinking


@dataclass
class Thinking:
    """A piece of the model's thinking, never part of the answer's content."""

    text: str


@dataclass
class ToolCalls:
    """Tool calls the model finished: ``{"id", "name", "arguments": {...}}``."""

    calls: list[dict[str, Any]]


@dataclass
class Logprobs:
    """Generated tokens' log-probabilities: ``{"token", "logprob", "bytes",
    "top_logprobs": [...]}`` each, in the order they were generated."""

    entries: list[dict[str, Any]]


Event = str | Thinking | ToolCalls | Logprobs | Finished


def paired(events: list[Event]) -> Iterator[tuple[Event, Logprobs | None]]:
    """Each event, a piece of text with the log-probabilities sent just before
    it (its tokens', from one runner message): Ollama and OpenAI put a token's
    text and its log-probabilities in one chunk, and clients pair them so."""
    i = 0
    while i < len(events):
        event = events[i]
        if isinstance(event, Logprobs) and i + 1 < len(events) and isinstance(events[i + 1], str):
            yield events[i + 1], event
            i += 2
        else:
            yield event, None
            i += 1


def route_events(
    events: list[Event],
    text: Callable[[str], None],
    thinking: Callable[[str], None],
    call: Callable[[dict[str, Any]], None],
    finished: Callable[[Finished], None],
) -> None:
    """Each event to its handler, each tool call on its own, for the APIs
    whose streams are typed events (Responses, Anthropic); logprobs are not
    part of those streams."""
    for event in events:
        if isinstance(event, str):
            text(event)
        elif isinstance(event, Thinking):
            thinking(event.text)
        elif isinstance(event, ToolCalls):
            for one in event.calls:
                call(one)
        elif isinstance(event, Finished):
            finished(event)


@dataclass
class Reply:
    """A whole completion, as a non-streaming answer reports it."""

    text: str
    thinking: str
    tool_calls: list[dict[str, Any]]
    finished: Finished
    logprobs: list[dict[str, Any]] = field(default_factory=list)


async def find_model(services: LLMServices, name: ModelName) -> ModelEntry:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, services.store.get, name)


async def complete(
    services: LLMServices, job: GenerationRequest, requester: Requester = LOCAL
) -> AsyncGenerator[list[Event], None]:
    """Batches of text pieces, the last batch ending with ``Finished``.

    Errors before the first batch (unknown model, bad input, server busy, no
    memory) raise as they are; closing the iterator cancels the generation and
    releases the runner. With a ``format``, output that ends by itself is
    checked against it afterwards (``output_check``) and a mismatch is logged.
    """
    with count_request(requester.name) as asked:
        async for events in _complete(services, job, requester, asked):
            yield events


async def _complete(
    services: LLMServices, job: GenerationRequest, requester: Requester, asked: Asked
) -> AsyncGenerator[list[Event], None]:
    started = time.perf_counter_ns()
    entry = await find_model(services, job.model)
    asked.model = entry.name.display
    messages = None if job.messages is None else with_model_messages(entry, job.messages)
    if messages is not None and (held := [i for m in entry.messages for i in m.get("images", ())]):
        brought = [*job.images, *(i for m in job.messages for i in m.get("images", ()))]
        try:  # decoded to be measured: not on the loop
            await asyncio.get_running_loop().run_in_executor(
                None, check_with_model_images, entry.digest, held, brought
            )
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
    if entry.projector_path is None and (
        job.images or any(m.get("images") for m in messages or ())
    ):  # never dropped: a model without a projector cannot see them
        raise InvalidRequest(f"model '{entry.name.display}' does not support images")
    await check_generates(services, entry, job.route)
    options = {**entry.params, **job.options}  # the model's parameters sit beneath
    job, options = held_whole(job, options)
    load = load_options(options)
    priority = job.priority or INTERACTIVE
    use = services.scheduler.use(entry, load, job.keep_alive, requester, priority)
    async with use as lease:
        request = runner_request(job, entry, messages, options, services.settings.stream_interval)
        stream = lease.runner.complete(request)
        text: list[str] = []  # kept only to check a format
        counted = Completion(entry.name.display, requester.name)
        held = Held(services.usage, requester.name, entry.name.display, lease, started)
        try:
            async for batch in stream:
                events: list[Event] = []
                for message in batch:
                    counted.saw(message["type"])
                    events.extend(runner_events(message, job.think))
                    if job.format is not None and message["type"] == "token":
                        text.append(message.get("text", ""))
                if events and isinstance(done := events[-1], Done):
                    asked.finished = True
                    held.done(done.prompt_eval_count, done.eval_count, done.eval_duration)
                    counted.done(
                        done.prompt_eval_count, done.eval_count, done.prompt_cached,
                        done.eval_duration,
                    )  # fmt: skip
                    counted.drafts(done.draft_tokens, done.draft_accepted)
                    counted.cache_hit(done.prompt_cache)
                    if job.format is not None and done.done_reason == "stop":
                        check_later(job.format, "".join(text))
                    total = time.perf_counter_ns() - started
                    events[-1] = finished(done, lease.load_duration_ns, total)
                yield events
        finally:
            held.close(counted.first_token)
            await stream.aclose()


def held_whole(
    job: GenerationRequest, options: dict[str, Any]
) -> tuple[GenerationRequest, dict[str, Any]]:
    """An answer held whole with log-probabilities ends with "length" at
    ``whole_logprobs`` entries: ``num_predict`` lowered, as the runner lowers
    -1 (-2, which fills the context, stays an answer without a shift)."""
    if not job.whole or job.logprobs is None:
        return job, options
    most = whole_answer_tokens(job.logprobs)
    asked = options.get("num_predict")
    asked = -1 if asked is None else int(asked)
    if 0 <= asked <= most:
        return job, options
    if asked == -2:
        job = replace(job, shift=False)
    return job, {**options, "num_predict": most}


def runner_request(
    job: GenerationRequest,
    entry: ModelEntry,
    messages: list[dict[str, Any]] | None,
    options: dict[str, Any],
    stream_interval: float,
) -> Complete:
    """The runner's ``complete`` message for ``job`` (``messages``: the chat
    with the model's own history; ``options``: with the model's parameters)."""
    chat = messages is not None
    return Complete(
        options=sampling_options(options),
        stream_interval=stream_interval,
        prompt="" if chat else job.prompt or "",
        images=[] if chat else list(job.images),
        messages=messages,
        tools=job.tools if chat else None,
        context=job.context or None,
        with_context=job.with_context,
        suffix=job.suffix or None,
        grammar=None if job.format is None else job.format.grammar,
        model=entry.name.display if job.tools else "",  # for the runner's error messages
        parallel_tool_calls=bool(job.parallel_tool_calls),
        logprobs=job.logprobs is not None,
        top_logprobs=job.logprobs or 0,
        think=job.think,
        relax_think=job.relax_think,
        tool_choice=job.tool_choice,
        truncate=job.truncate,
        shift=job.shift,
        priority=job.priority or INTERACTIVE,
    )


def runner_events(message: dict[str, Any], think: bool | str | None) -> list[Event | Done]:
    """One runner reply as events, read strictly (``protocol.read``)."""
    try:
        return reply_events(message, think)
    except ProtocolError as e:
        raise RunnerFailed(f"the runner's answer could not be read: {e}") from None


def reply_events(message: dict[str, Any], think: bool | str | None) -> list[Event | Done]:
    kind = message["type"]
    if kind == "token":
        token = read(Token, message)
        events: list[Event | Done] = []
        # asked not to think, a model that thinks anyway: never content
        if token.thinking and think is not False:
            events.append(Thinking(token.thinking))
        if token.logprobs:
            events.append(Logprobs(list(token.logprobs)))
        if token.text:
            events.append(token.text)
        return events
    if kind == "tool_calls":
        return [ToolCalls(list(read(ToolCallsReply, message).tool_calls))]
    if kind == "done":
        return [read(Done, message)]
    return []


def finished(done: Done, load_duration: int, total_duration: int) -> Finished:
    return Finished(
        done_reason=done.done_reason,
        prompt_eval_count=done.prompt_eval_count,
        prompt_eval_duration=done.prompt_eval_duration,
        eval_count=done.eval_count,
        eval_duration=done.eval_duration,
        load_duration=load_duration,
        total_duration=total_duration,
        context=done.context,
        stop_sequence=done.stop_sequence,
        prompt_cached=done.prompt_cached,
        prompt_cache=done.prompt_cache,
        draft_tokens=done.draft_tokens,
        draft_accepted=done.draft_accepted,
        thinking_tokens=done.thinking_tokens,
    )


async def collect(batches: AsyncIterator[list[Event]]) -> Reply | None:
    """The whole completion; ``None`` if ``batches`` ended first (the client left)."""
    parts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    async for batch in batches:
        for event in batch:
            if isinstance(event, str):
                parts.append(event)
            elif isinstance(event, Thinking):
                thinking.append(event.text)
            elif isinstance(event, ToolCalls):
                calls.extend(event.calls)
            elif isinstance(event, Logprobs):
                logprobs.extend(event.entries)
            else:
                return Reply("".join(parts), "".join(thinking), calls, event, logprobs)
    return None


def load_options(options: dict[str, Any]) -> LoadOptions:
    """The load-time part of Ollama options."""
    return LoadOptions(
        num_ctx=options.get("num_ctx"),
        num_batch=options.get("num_batch"),
        num_thread=options.get("num_thread") or None,
        use_mmap=options.get("use_mmap"),
        num_gpu=options.get("num_gpu"),
    )


def with_model_messages(entry: ModelEntry, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's own MESSAGE history and SYSTEM prompt go first, unless the
    request brings its own system message."""
    head = list(entry.messages)
    if entry.system and not any(m.get("role") == "system" for m in messages):
        head.insert(0, {"role": "system", "content": entry.system})
    return [*head, *messages]


@dataclass
class Embedded:
    vectors: list[str]  # each the JSON text of one response element, as the runner wrote it
    prompt_eval_count: int
    load_duration: int
    total_duration: int


async def embed(
    services: LLMServices,
    model: ModelName,
    inputs: list[str],
    *,
    truncate: bool = True,
    dimensions: int | None = None,
    normalize: bool | None = True,  # None: as the legacy /api/embeddings does
    encoding: str = "float",  # "base64": OpenAI's float32 strings
    options: dict[str, Any] | None = None,
    keep_alive: float | None = None,
    requester: Requester = LOCAL,
) -> Embedded:
    """The vectors of ``inputs``, as JSON texts the handler writes without
    decoding them (``api.base.json_pieces``): the event loop never holds the numbers."""
    with count_request(requester.name) as asked:
        started = time.perf_counter_ns()
        entry = await find_model(services, model)
        asked.model = entry.name.display
        load = load_options({**entry.params, **(options or {})})
        async with services.scheduler.use(entry, load, keep_alive, requester) as lease:
            held = Held(services.usage, requester.name, entry.name.display, lease, started)
            reply = await lease.runner.embed(
                Embed(
                    inputs=inputs,
                    truncate=truncate,
                    dimensions=dimensions,
                    normalize=normalize,
                    encoding=encoding,
                )
            )
            asked.finished = True
            held.done(reply.get("prompt_eval_count", 0), 0, 0)
            held.close()  # an embedding that failed holds its slot briefly: not counted
            Completion(entry.name.display, requester.name).done(
                reply.get("prompt_eval_count", 0), 0, 0, 0
            )
            return Embedded(
                vectors=reply["vectors"],
                prompt_eval_count=reply.get("prompt_eval_count", 0),
                load_duration=lease.load_duration_ns,
                total_duration=time.perf_counter_ns() - started,
            )


async def check_generates(services: LLMServices, entry: ModelEntry, route: str) -> None:
    """Ollama's capability check, before a load: a model that only embeds (a
    pooling type, no output layer: BERT) does not ``route`` ("generate",
    "chat"); llama.cpp aborted the runner on its first long prompt."""
    if (await services.scheduler.model_info(entry)).embedding_only:
        raise InvalidRequest(f'"{entry.name.display}" does not support {route}')


async def load_only(
    services: LLMServices,
    model: ModelName,
    options: dict[str, Any],
    keep_alive: float | None,
    requester: Requester = LOCAL,
    route: str = "",
) -> int:
    """Load (or keep) a model without generating; returns the load time.
    ``route``: the generation route that asked ("" for ``/api/embed``)."""
    entry = await find_model(services, model)
    if route:  # a generation route's load: as Ollama, not for a model that only embeds
        await check_generates(services, entry, route)
    load = load_options({**entry.params, **options})
    async with services.scheduler.use(entry, load, keep_alive, requester) as lease:
        return lease.load_duration_ns


async def unload(services: LLMServices, model: ModelName, requester: Requester = LOCAL) -> None:
    entry = await find_model(services, model)
    await services.scheduler.unload(entry.name.display, requester)
