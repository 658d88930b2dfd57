"""The runner wire protocol: newline-delimited JSON over a private socketpair.

Requests:  {"id": int, "op": "info"|"load"|"complete"|"embed"|"tokenize"|"health"|"cancel"
            |"close", ...}
Replies:   {"id": int, "type": "result"|"token"|"tool_calls"|"done"|"embedding"|"progress"
            |"error", ...}

The fields of the requests ``load`` (``LoadParams``), ``complete``
(``Complete``) and ``embed`` (``Embed``), of the replies ``token``
(``Token``), ``tool_calls`` (``ToolCallsReply``), ``done`` (``Done``) and
``error`` (``Error``), and of ``health``'s result (``Health``) are these
dataclasses, the one definition both sides use: ``read`` refuses a message with a field it does not
know or without one it needs (``ProtocolError``), so a misspelt key fails at
the boundary instead of being dropped.

``complete`` streams ``token`` messages then one ``done``; ``embed`` streams
``embedding`` messages (``vectors``: a part of the vectors in order, each the
JSON text of one response element, each line at most the request's
``part_bytes``) then one ``result``; every other op answers with one
``result`` (or ``error``). ``cancel`` names the id of a running request.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

# The "kind" of an error reply, for failures the server acts on:
INVALID = "invalid"  # caused by the request itself (HTTP 400)
ALLOCATION = "allocation"  # llama.cpp could not allocate memory (the scheduler may retry)


class EngineError(Exception):
    """A failure the runner reports to the server as an ``error`` reply."""


class InputError(EngineError):
    """The request cannot be served as asked: the server answers 400."""


class AllocationError(EngineError):
    """llama.cpp reported a failed allocation while this request ran."""


class ProtocolError(InputError):
    """A message whose fields are not its type's: unknown or missing ones."""


T = TypeVar("T")

ENVELOPE = frozenset({"id", "op", "type"})  # every message's own fields


def read(kind: type[T], message: dict[str, Any]) -> T:
    """``message``'s fields (beside ``id``/``op``/``type``) as ``kind``."""
    known = {f.name: f for f in fields(kind)}  # type: ignore[arg-type]
    body = {k: v for k, v in message.items() if k not in ENVELOPE}
    if unknown := sorted(set(body) - set(known)):
        raise ProtocolError(f"{kind.__name__} has no field {', '.join(map(repr, unknown))}")
    needed = (
        name
        for name, f in known.items()
        if f.default is MISSING and f.default_factory is MISSING and name not in body
    )
    if missing := sorted(needed):
        raise ProtocolError(f"{kind.__name__} needs {', '.join(map(repr, missing))}")
    return kind(**body)


def fields_of(message: Any) -> dict[str, Any]:
    """A typed message's fields as they go on the wire: shallow, a nested
    typed value as its fields. Not ``asdict``, which deep-copies every
    list and dict: a chat of 80k messages took 0.46 s of the server's loop."""
    return {
        f.name: fields_of(v) if is_dataclass(v := getattr(message, f.name)) else v
        for f in fields(message)
    }


def compact(message: Any) -> dict[str, Any]:
    """A typed message's fields, less those at their default (the frequent
    ``token`` stays short; ``read`` fills them back in)."""
    out = {}
    for f in fields(message):
        value = getattr(message, f.name)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if value != default or (f.default is MISSING and f.default_factory is MISSING):
            out[f.name] = value
    return out


@dataclass(frozen=True)
class LoadParams:
    """``load``: everything that fixes a runner at load time."""

    path: str
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0  # 0: the physical cores the runner may use
    adapt_threads: bool = False  # n_threads is the default: fewer while others hold cores
    n_gpu_layers: int = 0
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    use_mmap: bool = True
    flash_attn: str = "auto"  # "auto" (llama.cpp's default), "on" or "off"
    n_seq: int = 1  # sequences decoded together, sharing the n_ctx cells
    projector: str = ""  # the image projector (mmproj GGUF) to load beside the model
    draft: str = ""  # a draft model's GGUF (same vocabulary) for speculation; "": prompt lookup
    kv_cache_type: str = "f16"  # "f16", "q8_0" or "q4_0" (runner/kv_cache.py)
    batch_invariant: bool = False  # q8_0 keys, no repacked weights (memory/kv_cache.py)
    prompt_disk: dict[str, Any] = field(default_factory=dict)  # runner/prompt_disk.py; {}: off
    prompt_ram: dict[str, Any] = field(default_factory=dict)  # runner/prompt_ram.py; {}: off

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensor_split", tuple(self.tensor_split))
        if self.flash_attn not in FLASH_ATTENTION:
            raise ProtocolError(f"flash_attn must be one of {', '.join(FLASH_ATTENTION)}")
        if self.kv_cache_type not in KV_CACHE_TYPES:
            raise ProtocolError(f"kv_cache_type must be one of {', '.join(KV_CACHE_TYPES)}")


FLASH_ATTENTION = ("auto", "on", "off")
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Complete:
    """``complete``: a prompt (with its images) or a chat, and how to sample it."""

    options: dict[str, Any] = field(default_factory=dict)  # sampling options (Ollama's)
    stream_interval: float = 0.1  # seconds between two token messages
    prompt: str = ""
    images: list[str] = field(default_factory=list)  # base64 image files for the prompt
    messages: list[dict[str, Any]] | None = None  # a chat, rendered by the model's template
    tools: list[Any] | None = None
    context: list[int] | None = None  # tokens of an earlier exchange, before the prompt
    suffix: str | None = None  # fill-in-the-middle
    grammar: str | None = None
    model: str = ""  # the model's name, for error messages
    parallel_tool_calls: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token, with ``logprobs``
    think: bool | str | None = None  # None: the template's default
    # thinking asked of a model that cannot think: the template's default, not a
    # 400 (Ollama's Anthropic route: Claude Code asks it of every model)
    relax_think: bool = False
    tool_choice: Any = None  # "auto" | "none" | "required" | {"name": ...}; None: auto
    truncate: bool = True  # cut an over-long prompt (else refuse it)
    shift: bool = True  # shift a full context (else stop, "length")
    priority: str = "interactive"  # "batch": may be paused for interactive work (runner.pausing)
    # the exchange's tokens in ``done`` (Ollama's generate): up to 11 contexts of them,
    # 9 MB at a 131k context, decoded on the server's loop for routes that drop them
    with_context: bool = False


@dataclass(frozen=True)
class Done:
    """``done``: how a completion ended (durations in nanoseconds)."""

    done_reason: str = "stop"
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    context: list[int] = field(default_factory=list)
    tool_calls_count: int = 0
    stop_sequence: str = ""  # the stop string that ended it (Anthropic reports it)
    prompt_cached: int = 0  # prompt tokens reused from the slot's cache, not evaluated
    prompt_cache: str = ""  # where those came from: "slot", "ram" or "disk" (runner/prompt_*.py)
    draft_tokens: int = 0  # output tokens drafted by prompt lookup (runner.speculative)
    draft_accepted: int = 0  # of those, the ones the model's own sampler confirmed
    thinking_tokens: int = 0  # output tokens whose text came out as thinking (runner.completion)
    threads: int = 0  # CPU threads decoding ran with at the end (runner.thread_tuning); 0: unknown
    # what the runner holds now, per device and kind, where it changed since it
    # last said (an embedding context made, prompts kept in RAM: runner.serve)
    allocations: dict[str, dict[str, int]] | None = None


@dataclass(frozen=True)
class Token:
    """``token``: generated text (and thinking), with its tokens' logprobs."""

    text: str
    thinking: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ToolCallsReply:
    """``tool_calls``: calls the model finished, ``{"id", "name", "arguments"}`` each."""

    tool_calls: list[dict[str, Any]]


@dataclass(frozen=True)
class Health:
    """``health``'s result, answered by the reader thread even mid-generation."""

    status: str
    loaded: bool
    busy: int | None  # the request in progress
    progress: int  # main-loop steps so far
    stalled_for: float  # seconds busy without a step


@dataclass(frozen=True)
class Error:
    """``error``: why a request failed; ``kind`` when the server acts on it."""

    error: str
    kind: str | None = None  # INVALID, ALLOCATION


@dataclass(frozen=True)
class Embed:
    """``embed``: texts to embed, and the shape of their vectors."""

    inputs: list[str]
    truncate: bool = True
    dimensions: int | None = None
    normalize: bool | None = True  # None: as Ollama's legacy route does for this model
    encoding: str = "float"  # "base64": float32 strings
    part_bytes: int = 64 << 10  # JSON of one ``embedding`` reply at most


ERROR_MARKERS = ("error", "failed to allocate", "out of memory", "ggml_assert", "exception")


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("runner message is not a JSON object")
    return message


# llama.cpp's words for a crash or a failed allocation: lines that name no
# request's text (a grammar's parse error quotes the grammar, a user's schema)
CRASH_MARKERS = ("ggml_assert", "ggml_abort", "failed to allocate", "out of memory")


def is_error_line(line: str, markers: tuple[str, ...] = ERROR_MARKERS) -> bool:
    """Does a runner stderr line look like the reason for a failure (one of
    ``markers``)?"""
    lowered = line.lower()
    return any(marker in lowered for marker in markers)


def is_crash_line(line: str) -> bool:
    """Does a runner stderr line report a crash, quoting nothing a request sent?"""
    return is_error_line(line, CRASH_MARKERS)
