"""Ollama's wire shapes, translated to and from the one generation request.

Pure functions over parsed JSON: a ``/api/generate`` or ``/api/chat`` body
becomes an ``OllamaCall`` (a ``GenerationRequest`` and how the client wants
its answer), and a finished generation, or its stream of events, becomes
Ollama's values. The handlers in ``api/ollama.py`` parse, call and write.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from jupyter_llm.api.base import RawJSON, json_array
from jupyter_llm.api.generation import (
    Embedded,
    Event,
    Finished,
    GenerationRequest,
    Logprobs,
    Reply,
    Thinking,
    ToolCalls,
    paired,
)
from jupyter_llm.api.requests import (
    checked,
    keep_alive_field,
    logprobs_field,
    messages_field,
    options_field,
    priority_field,
    think_field,
    tool_choice_field,
    tools_field,
    typed_field,
)
from jupyter_llm.api.structured import parse_format
from jupyter_llm.api.templates import render_go_template
from jupyter_llm.chat_formats.detect import ChatFormat
from jupyter_llm.chat_formats.tool_grammar import CHOICES as TOOL_CHOICES
from jupyter_llm.models.draft import draft_source
from jupyter_llm.models.gguf_header import TensorInfo
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.images import parse_images
from jupyter_llm.request.limits import LICENSES, TEXT_LAYER


def now_iso() -> str:
    """Ollama's ``created_at``: UTC as Go's RFC 3339 with nanoseconds writes
    it (``2026-12-08T00:18:12.392186513Z``, trailing zeros dropped)."""
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{stamp}.{fraction}Z" if fraction else f"{stamp}Z"


def iso(moment: datetime) -> str:
    """A moment as Go's RFC 3339 with nanoseconds writes it: its fraction's
    trailing zeros dropped, UTC as ``Z``."""
    text = moment.isoformat().replace("+00:00", "Z")
    head, dot, rest = text.partition(".")
    if not dot:
        return text
    digits = rest[:6].rstrip("0")
    return f"{head}.{digits}{rest[6:]}" if digits else head + rest[6:]


# -- bodies -> a generation request --------------------------------------------------


@dataclass
class OllamaCall:
    """An ``/api/generate`` or ``/api/chat`` body: the generation it asks for,
    and how it wants the answer."""

    generation: GenerationRequest
    stream: bool = True
    only_load: bool = False  # nothing to generate: load the model (keep_alive 0: unload)


def shared_fields(body: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """``stream``, and the ``GenerationRequest`` fields both endpoints take."""
    model = parse_model_name(body.get("model"))
    stream = typed_field(body, "stream", bool, "a boolean", True)
    return stream, {
        "model": model,
        "options": options_field(body.get("options")),
        "keep_alive": keep_alive_field(body),
        "format": parse_format(body.get("format")),
        "think": think_field(body.get("think")),
        "logprobs": logprobs_field(body.get("logprobs"), body.get("top_logprobs")),
        "truncate": typed_field(body, "truncate", bool, "a boolean", True),
        "shift": typed_field(body, "shift", bool, "a boolean", True),
        "priority": priority_field(body),
    }


def context_field(body: dict[str, Any]) -> list[int] | None:
    context = typed_field(body, "context", list, "a list of token ids")
    if context is not None and not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in context
    ):
        raise InvalidRequest("context must be a list of token ids (non-negative integers)")
    return context


def generate_call(body: dict[str, Any]) -> OllamaCall:
    """An ``/api/generate`` body: a prompt as it is (``raw``, or a ``suffix``
    to fill in), one rendered by the request's own Go ``template``, or else
    a chat turn for the model's template. A request's template may be as long
    as the body: call this off the event loop."""
    context = context_field(body)
    stream, fields = shared_fields(body)
    prompt = typed_field(body, "prompt", str, "a string", "")
    system = typed_field(body, "system", str, "a string")
    raw = typed_field(body, "raw", bool, "a boolean", False)
    # "" is unset, as in Ollama (older clients send "" for both)
    template = typed_field(body, "template", str, "a string") or None
    suffix = typed_field(body, "suffix", str, "a string") or None
    images = checked(parse_images, body.get("images"))
    request = GenerationRequest(
        **fields, context=context, suffix=suffix, route="generate", with_context=True
    )
    if raw or suffix is not None:
        request.prompt, request.images = prompt, images
    elif template is not None:
        values = {"System": system or "", "Prompt": prompt}
        request.prompt, request.images = render_go_template(template, values), images
    else:
        request.messages = chat_turn(system, prompt, images)
    only_load = not prompt and not images and suffix is None
    return OllamaCall(request, stream, only_load)


def chat_turn(system: str | None, prompt: str, images: list[str]) -> list[dict[str, Any]]:
    """A generate request's prompt as the messages of one chat turn."""
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    user: dict[str, Any] = {"role": "user", "content": prompt}
    if images:
        user["images"] = images
    messages.append(user)
    return messages


def chat_call(body: dict[str, Any]) -> OllamaCall:
    """An ``/api/chat`` body. Images are decoded and tool schemas checked:
    call this off the event loop."""
    stream, fields = shared_fields(body)
    tools = tools_field(body.get("tools"))
    # not an Ollama field: also read from options, which Ollama's clients pass on
    choice = body.get("tool_choice", fields["options"].pop("tool_choice", None))
    if isinstance(choice, str) and choice not in TOOL_CHOICES:
        choice = {"type": "function", "function": {"name": choice}}
    messages = messages_field(body.get("messages"))
    request = GenerationRequest(
        **fields, messages=messages, tools=tools, tool_choice=tool_choice_field(choice, tools)
    )
    return OllamaCall(request, stream, only_load=not messages)


# -- a generation -> Ollama's values --------------------------------------------------


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
    """The last value's fields; a metric that is 0 is left out, as Ollama's
    ``Metrics`` (``omitempty``) leaves it (a model already loaded: no
    ``load_duration``)."""
    metrics = {
        "total_duration": f.total_duration,
        "load_duration": f.load_duration,
        "prompt_eval_count": f.prompt_eval_count,
        "prompt_eval_duration": f.prompt_eval_duration,
        "eval_count": f.eval_count,
        "eval_duration": f.eval_duration,
    }
    return (
        {"done": True, "done_reason": f.done_reason}
        | {key: value for key, value in metrics.items() if value}
        | draft_fields(f)
        | cache_fields(f)
    )


def cache_fields(f: Finished) -> dict[str, Any]:
    """A hit in a prompt cache that outlived its slot (Ollama has none):
    ``prompt_cache`` "ram" or "disk", ``prompt_cached`` the tokens not
    evaluated again. A slot's own reuse stays out of the chunk, as before
    (OpenAI's ``cached_tokens`` counts every kind)."""
    if not f.prompt_cached or f.prompt_cache not in ("ram", "disk"):
        return {}
    return {"prompt_cache": f.prompt_cache, "prompt_cached": f.prompt_cached}


def draft_fields(f: Finished) -> dict[str, Any]:
    """Speculative decoding's counters, where it drafted (names as ``Done``'s;
    Ollama has none: llama-server's ``timings`` say draft_n, draft_n_accepted)."""
    if not f.draft_tokens:
        return {}
    return {"draft_tokens": f.draft_tokens, "draft_accepted": f.draft_accepted}


class OllamaEncoder:
    """One generation's answer in an endpoint's shape: the whole reply, or
    each batch of stream events as NDJSON values. It counts the tool calls
    streamed so far (their ``index``); ``now`` stamps ``created_at``."""

    def __init__(self, model: str, now: Callable[[], str] = now_iso) -> None:
        self.model = model
        self.now = now
        self.calls_sent = 0

    def piece(
        self, text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """A value with content, thinking and tool calls, in this endpoint's shape."""
        raise NotImplementedError

    def final_fields(self, f: Finished) -> dict[str, Any]:
        """What this endpoint adds to the last value."""
        return {}

    def loaded(self, reason: str) -> dict[str, Any]:
        """The answer to a request with nothing to generate ("load", "unload")."""
        return {**self.piece(""), "done": True, "done_reason": reason}

    def whole(self, reply: Reply, logprobs: bool) -> dict[str, Any]:
        """The answer with ``stream: false``."""
        calls = ollama_tool_calls(reply.tool_calls, 0)
        value = {
            **self.piece(reply.text, reply.thinking, calls),
            **done_fields(reply.finished),
            **self.final_fields(reply.finished),
        }
        if logprobs:
            value["logprobs"] = reply.logprobs
        return value

    def event(self, e: Event) -> dict[str, Any]:
        if isinstance(e, str):
            return {**self.piece(e), "done": False}
        if isinstance(e, Thinking):
            return {**self.piece("", e.text), "done": False}
        if isinstance(e, ToolCalls):
            calls = ollama_tool_calls(e.calls, self.calls_sent)
            self.calls_sent += len(calls)
            return {**self.piece("", "", calls), "done": False}
        if isinstance(e, Logprobs):
            return {**self.piece(""), "logprobs": e.entries, "done": False}
        return {**self.piece(""), **done_fields(e), **self.final_fields(e)}

    def batch(self, events: list[Event]) -> list[dict[str, Any]]:
        out = []
        for event, logprobs in paired(events):
            value = self.event(event)
            if logprobs is not None:
                value["logprobs"] = logprobs.entries
            out.append(value)
        return out


class GenerateEncoder(OllamaEncoder):
    """``/api/generate``: ``response`` text, the tokens of the exchange (``context``) last."""

    def piece(
        self, text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        out = {"model": self.model, "created_at": self.now(), "response": text}
        return {**out, "thinking": thinking} if thinking else out

    def final_fields(self, f: Finished) -> dict[str, Any]:
        return {"context": f.context}


class ChatEncoder(OllamaEncoder):
    """``/api/chat``: an assistant ``message``."""

    def piece(
        self, text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        return {
            "model": self.model,
            "created_at": self.now(),
            "message": message_fields(text, thinking, calls),
        }


def embed_body(model: str, result: Embedded) -> dict[str, Any]:
    """``/api/embed``'s answer around the vectors, each as the runner wrote it;
    a metric that is 0 left out (``EmbedResponse`` is ``omitempty``)."""
    metrics = {
        "total_duration": result.total_duration,
        "load_duration": result.load_duration,
        "prompt_eval_count": result.prompt_eval_count,
    }
    body = {"model": model, "embeddings": json_array(result.vectors)}
    return body | {key: value for key, value in metrics.items() if value}


def embedding_body(result: Embedded) -> dict[str, Any]:
    """The legacy ``/api/embeddings``' answer: its one vector as the runner wrote it."""
    return {"embedding": RawJSON(result.vectors[:1])}


# -- models -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TagFacts:
    """What ``/api/tags`` lists from a model's files, read as ``/api/show``
    reads them (``api/ollama.py`` keeps them per manifest digest)."""

    capabilities: tuple[str, ...] = ()
    context_length: int = 0  # its GGUF's ``<arch>.context_length`` (0: none)
    embedding_length: int = 0


def model_summary(entry: ModelEntry, facts: TagFacts | None = None) -> dict[str, Any]:
    """A model as ``/api/tags`` lists it: Ollama's ``ListModelResponse``, whose
    lengths and capabilities are left out when empty (``omitempty``), as for a
    model whose files were not read yet (``facts`` None)."""
    facts = facts or TagFacts()
    details = dict(entry.details)
    for key in ("context_length", "embedding_length"):
        if getattr(facts, key):
            details[key] = getattr(facts, key)
    summary = {
        "name": entry.name.display,
        "model": entry.name.display,
        "modified_at": iso(entry.modified_at),
        "size": entry.size,
        "digest": entry.digest,
        "details": details,
    }
    if facts.capabilities:
        summary["capabilities"] = list(facts.capabilities)
    return summary


def model_capabilities(info: dict[str, Any], fmt: ChatFormat) -> list[str]:
    """Ollama's ``capabilities``: a model that declares a pooling type embeds,
    any other completes (never both, as in Ollama's server/images.go). Tools
    and thinking are what ``chat_formats.detect`` read in its template."""
    if any(key.endswith(".pooling_type") for key in info):
        capabilities = ["embedding"]
    else:
        capabilities = ["completion"]
        if "tokenizer.ggml.fim_pre_token_id" in info:
            capabilities.append("insert")
    if fmt.offers_tools:
        capabilities.append("tools")
    if fmt.can_think:
        capabilities.append("thinking")
    return capabilities


def show_capabilities(info: dict[str, Any], fmt: ChatFormat, vision: bool) -> list[str]:
    """``capabilities`` as ``/api/show`` and ``/api/tags`` both list them: a
    model with a projector also sees."""
    return model_capabilities(info, fmt) + (["vision"] if vision else [])


def tag_facts(info: dict[str, Any], fmt: ChatFormat, vision: bool) -> TagFacts:
    """``/api/tags``' facts from a model GGUF's keys (``ShowRead.info``)."""
    arch = info.get("general.architecture")

    def length(key: str) -> int:
        value = info.get(f"{arch}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    capabilities = tuple(show_capabilities(info, fmt, vision))
    return TagFacts(capabilities, length("context_length"), length("embedding_length"))


# Go's text forms: Ollama writes ``parameters`` with ``%#v`` and the
# Modelfile's PARAMETER lines with ``%v``, of values decoded from JSON (so every
# number is a float64). Clients and Ollama's own tests read these texts.

_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: printable characters as they are, the others
    escaped (``\\n``, ``\\x1b``, ``\\u200b``)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif 0xD800 <= code < 0xE000:  # a lone surrogate: Go's JSON decoder makes it U+FFFD
            out.append("\ufffd")
        elif ch.isprintable():  # Go's unicode.IsPrint: graphic, or the ASCII space
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_float(value: float) -> str:
    """Go's ``%v`` of a float64 (``strconv.FormatFloat(v, 'g', -1, 64)``): the
    shortest digits that read back, in exponent form when the exponent is
    below -4 or 6 and over (``1e+06``, ``1e-05``, ``0.0001``, ``123456``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    exact = Decimal(repr(abs(value))).as_tuple()  # repr: the shortest digits, as Go's
    digits = "".join(map(str, exact.digits)).rstrip("0")
    point = len(exact.digits) + int(exact.exponent)  # the value is 0.<digits> * 10**point
    exponent = point - 1
    if exponent < -4 or exponent >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    whole, fraction = digits[:point].ljust(point, "0"), digits[point:]
    return sign + whole + ("." + fraction if fraction else "")


def go_syntax(value: Any) -> str:
    """Go's ``%#v`` of a value decoded from JSON: strings quoted, numbers as float64."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return go_float(float(value))
    if isinstance(value, str):
        return go_quote(value)
    if value is None:
        return "<nil>"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(go_syntax(v) for v in value) + "}"
    if isinstance(value, dict):  # fmt sorts a map's keys
        items = (f"{go_quote(str(k))}:{go_syntax(value[k])}" for k in sorted(value))
        return "map[string]interface {}{" + ", ".join(items) + "}"
    return go_quote(str(value))


def format_parameters(params: dict[str, Any]) -> str:
    """Ollama's ``parameters`` text: ``%-30s %#v`` per value, a list's items
    one line each (routes.go's GetModelInfo)."""
    lines = []
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{key:<30} {go_syntax(item)}")
    return "\n".join(lines)


def modelfile_quote(text: str) -> str:
    """An argument as Ollama's Modelfile writer quotes it (parser.quote)."""
    if "\n" in text or text.startswith(" ") or text.endswith(" "):
        return f'"""{text}"""' if '"' in text else f'"{text}"'
    return text


def parameter_text(value: Any) -> str:
    """A PARAMETER's value: Go's ``%v``, except that an integer is written
    whole (Go writes a float64 ``1e+06``, which a Modelfile's integer
    parameter does not read back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    return str(value)


MODELFILE_HEAD = (
    '# Modelfile generated by "ollama show"\n'
    "# To build a new Modelfile based on this, replace FROM with:\n"
)


def modelfile_text(entry: ModelEntry) -> str:
    """``/api/show``'s ``modelfile``, as Ollama's ``Model.String`` writes it:
    the model file, its draft, its projector, then template, system prompt,
    parameters, license and messages, so that ``create`` from it (as Ollama's
    parser reads it) makes the same model again. A template is written only
    where the model has its own (Ollama writes its default ``{{ .Prompt }}``
    otherwise, which would replace the GGUF's chat template here)."""
    lines = [f"FROM {entry.model_path}"]
    if entry.draft_path is not None:
        lines.append(f"DRAFT {modelfile_quote(str(entry.draft_path))}")
    if entry.projector_path is not None:
        lines.append(f"FROM {entry.projector_path}")
    if entry.template is not None:
        lines.append(f"TEMPLATE {modelfile_quote(entry.template)}")
    if entry.system:
        lines.append(f"SYSTEM {modelfile_quote(entry.system)}")
    for key, value in entry.params.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"PARAMETER {key} {modelfile_quote(parameter_text(item))}")
    if entry.license is not None:
        lines.append(f"LICENSE {modelfile_quote(entry.license)}")
    for message in show_messages(entry.messages):
        lines.append(f"MESSAGE {message['role']} {modelfile_quote(message['content'])}")
    head = f"{MODELFILE_HEAD}# FROM {entry.name.display}\n\n"
    return head + "".join(line + "\n" for line in lines)


def show_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A model's messages as Ollama shows them: role and content only."""
    return [
        {"role": str(m.get("role") or ""), "content": str(m.get("content") or "")}
        for m in messages
        if isinstance(m, dict)
    ]


@dataclass
class ShowRead:
    """What ``/api/show`` reads from a model's files."""

    info: dict[str, Any]  # the model GGUF's keys
    template: str  # the one it chats in: its Modelfile's, else its GGUF's or family's ("": none)
    builtin: str | None  # the family's built-in template's name, where the GGUF has none
    projector_info: dict[str, Any] | None  # the vision projector GGUF's keys
    chat_format: ChatFormat  # read from ``template``
    tensors: tuple[TensorInfo, ...] = ()  # the model GGUF's tensor table


# model_info keys Ollama deletes: the name is the GGUF's, not the model's, and
# the template is sent as ``template``
HIDDEN_INFO = ("general.name", "tokenizer.chat_template")
SHOW_ALWAYS = ("details", "model_info", "modified_at")  # the rest are omitempty


def show_tensors(tensors: tuple[TensorInfo, ...]) -> list[dict[str, Any]]:
    """Ollama's ``tensors``: every tensor's name, ggml type and shape (ne[0]
    first), verbose or not. The header reader caps their number (MAX_TENSORS)."""
    names = tensor_type_names()
    return [
        {"name": t.name, "type": names.get(t.ggml_type, "unknown"), "shape": list(t.dims)}
        for t in tensors
    ]


@functools.cache
def tensor_type_names() -> dict[int, str]:
    """ggml's type names, which are Ollama's ``TensorType.String()`` (loaded on
    first use: the gguf package costs numpy)."""
    from gguf.constants import GGMLQuantizationType

    return {int(t): t.name for t in GGMLQuantizationType}


def show_body(entry: ModelEntry, read: ShowRead) -> dict[str, Any]:
    """``/api/show``'s answer (every tensor shaped, the keys copied: call it
    off the loop), in the order of Ollama's ``ShowResponse``, its empty
    fields left out."""
    details = entry.details
    if read.builtin is not None:  # the family's template a GGUF without one chats in
        details = {**details, "builtin_template": read.builtin}
    if entry.draft_path is not None:  # which draft model speculates (Ollama has none)
        draft = {"model": entry.draft_from, "digest": "sha256:" + entry.draft_path.name[7:]}
        details = {**details, "draft": draft}
    body = {
        "license": entry.license or "",
        "modelfile": modelfile_text(entry),
        "parameters": format_parameters(entry.params),
        "template": read.template,
        "system": entry.system or "",
        "details": details,
        "messages": show_messages(entry.messages),
        "model_info": {k: v for k, v in read.info.items() if k not in HIDDEN_INFO},
        # its GGUF's keys, as model_info is the model's
        "projector_info": read.projector_info,
        "tensors": show_tensors(read.tensors),
        "capabilities": show_capabilities(read.info, read.chat_format, entry.vision),
        "modified_at": iso(entry.modified_at),
    }
    return {key: value for key, value in body.items() if value or key in SHOW_ALWAYS}


@dataclass
class CreateCall:
    """An ``/api/create`` body: a model from uploaded ``files`` or an existing
    model (``source``), with its texts, parameters and messages."""

    name: ModelName
    files: Any
    template: str | None
    system: str | None
    source: ModelName | None
    parameters: dict[str, Any]
    messages: list[dict[str, Any]] | None
    license: str | list[str] | None
    stream: bool = True
    draft: str | ModelName | None = None  # a blob digest or a model (models.draft)

    def texts(self) -> dict[str, str | None]:
        """The text layers it writes, each named by its field."""
        texts = {"template": self.template, "system": self.system}
        if self.messages:  # the store keeps them as this JSON
            texts["messages"] = json.dumps(self.messages)
        if isinstance(self.license, str):
            texts["license"] = self.license
        else:
            texts.update((f"license[{i}]", text) for i, text in enumerate(self.license or []))
        return texts


def create_call(body: dict[str, Any]) -> CreateCall:
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
    if isinstance(license_, list):  # each is a layer the store writes and hashes
        checked(LICENSES.check, "license", len(license_))
    stream = typed_field(body, "stream", bool, "a boolean", True)
    draft = None if body.get("draft") is None else draft_source(body["draft"])
    return CreateCall(
        name,
        body.get("files"),
        body.get("template"),
        body.get("system"),
        source,
        parameters,
        messages,
        license_,
        stream,
        draft,
    )


def check_text_layer(field: str, text: str | None) -> None:
    """``InvalidRequest`` for a text the store would refuse to read back (a
    layer over ``TEXT_LAYER`` bytes), before anything is written. Encoding a
    4 MiB text is CPU work: call this off the event loop."""
    if text is None or len(text) * 4 <= TEXT_LAYER.value:
        return
    checked(TEXT_LAYER.check, field, len(text.encode("utf-8", "surrogatepass")))
