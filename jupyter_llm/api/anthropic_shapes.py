"""Anthropic's Messages API shapes, translated to and from the one generation request.

Pure functions over parsed JSON, as ``api/openai_shapes.py`` is for OpenAI:
a ``/v1/messages`` body becomes a ``MessagesCall`` (a ``GenerationRequest``
and whether to stream), its content blocks become the chat messages every
API shares (checked once more by ``request/messages.py``), and a finished
generation, or its stream of events, becomes Anthropic's ``message`` and
its named server-sent events. The handlers in ``api/anthropic.py`` parse,
call and write.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.api.generation import (
    Event,
    Finished,
    GenerationRequest,
    Reply,
    route_events,
)
from jupyter_llm.api.openai_shapes import stream_flag
from jupyter_llm.api.requests import checked, messages_field, named_tools_field, priority_field
from jupyter_llm.api.structured import invalid_format, parse_format
from jupyter_llm.chat_formats.detect import THINK_LEVELS
from jupyter_llm.grammar.check import OutputFormat
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.images import parse_image
from jupyter_llm.request.limits import CONTENT_BLOCKS, SYSTEM_BYTES, TOOL_NAME, check_stops
from jupyter_llm.request.options import OPTION_TYPES, check_option

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
# Anthropic's sampling fields: the Ollama option each sets, and Anthropic's range
SAMPLING = {
    "temperature": ("temperature", 0, 1),
    "top_p": ("top_p", 0, 1),
    "top_k": ("top_k", 0, None),
}
DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # Anthropic's: no nucleus cut unless asked
THINKING_DEFAULT = ("adaptive", "between_tools")  # the model decides: its template's default
CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and "tool", naming one
USER_BLOCKS = "user turns take text, image and tool_result"
ASSISTANT_BLOCKS = "assistant turns take text, thinking, redacted_thinking and tool_use"
EMPTY = {  # a streamed block as it opens
    "text": {"type": "text", "text": ""},
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """A whole error response (or a stream's ``error`` event) in Anthropic's shape."""
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# -- a body -> a generation request ------------------------------------------------------


@dataclass
class MessagesCall:
    """A ``/v1/messages`` body: the generation it asks for, and how it wants the answer."""

    generation: GenerationRequest
    stream: bool = False


@dataclass
class Blocks:
    """Content blocks counted across one request (``CONTENT_BLOCKS``)."""

    seen: int = 0

    def add(self, n: int) -> None:
        self.seen += n
        checked(CONTENT_BLOCKS.check, "the request's content blocks", self.seen)


def messages_call(body: dict[str, Any]) -> MessagesCall:
    """A ``/v1/messages`` body. Images are decoded and tool schemas checked:
    call this off the event loop."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise InvalidRequest("max_tokens: Field required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequest("max_tokens must be a positive integer")
    request = generation(body, max_tokens)
    request.options = {**sampling(body), "num_predict": max_tokens}
    request.priority = priority_field(body)
    return MessagesCall(request, stream_flag(body))


def count_call(body: dict[str, Any]) -> GenerationRequest:
    """A ``/v1/messages/count_tokens`` body: the same prompt, evaluated and
    nothing generated (``num_predict`` 0), never truncated to fit."""
    request = generation(body, None)
    request.options = {"num_predict": 0}
    request.truncate = False
    return request


def generation(body: dict[str, Any], max_tokens: int | None) -> GenerationRequest:
    """What both routes share: the model, the chat, tools and thinking."""
    blocks = Blocks()
    tools = tools_of(body.get("tools"))
    choice, parallel = tool_choice_of(body.get("tool_choice"), tools)
    chat = [*system_messages(body.get("system"), blocks), *chat_messages(body, blocks)]
    return GenerationRequest(
        model=parse_model_name(body.get("model")),
        messages=messages_field(chat),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        think=thinking_of(body.get("thinking"), max_tokens, body.get("output_config")),
        relax_think=True,  # as Ollama: Claude Code asks every model to think
        format=output_format(body.get("output_config")),
    )


def sampling(body: dict[str, Any]) -> dict[str, Any]:
    """``temperature``, ``top_p``, ``top_k`` and ``stop_sequences`` as Ollama options."""
    options = dict(DEFAULTS)
    for key, (option, low, high) in SAMPLING.items():
        if (value := body.get(key)) is not None:
            spec = OPTION_TYPES[option]._replace(low=low, high=high)
            options[option] = checked(check_option, key, spec, value)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise InvalidRequest("stop_sequences must be a list of strings")
        checked(check_stops, stops, "stop_sequences")
        options["stop"] = stops
    return options


def thinking_of(raw: Any, max_tokens: int | None, config: Any = None) -> bool | str | None:
    """``thinking`` as ``think``: enabled, disabled, or the template's default
    when absent or when the model may decide (``adaptive``, ``between_tools``).
    ``budget_tokens`` must be below ``max_tokens``, as Anthropic checks it;
    ``max_tokens`` bounds thinking and answer together. Without ``thinking``
    (or with a default), ``output_config.effort`` is the level, as Ollama
    reads it."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if raw is None or kind in THINKING_DEFAULT:
        return effort_of(config)
    if kind == "disabled":
        return False
    if kind != "enabled":
        raise InvalidRequest(
            'thinking.type must be "enabled" (with budget_tokens), "adaptive", '
            '"between_tools" or "disabled"'
        )
    budget = raw.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InvalidRequest("thinking.budget_tokens must be a positive integer")
    if max_tokens is not None and budget >= max_tokens:
        raise InvalidRequest("thinking.budget_tokens must be less than max_tokens")
    return True


def effort_of(config: Any) -> str | None:
    """``output_config.effort`` as a thinking level (``xhigh`` as ``high``,
    any case); another value, or none, leaves the template's default."""
    effort = config.get("effort") if isinstance(config, dict) else None
    if not isinstance(effort, str):
        return None
    effort = effort.strip().lower()
    effort = "high" if effort == "xhigh" else effort
    return effort if effort in THINK_LEVELS else None


def output_format(raw: Any) -> OutputFormat | None:
    """``output_config.format``: a JSON Schema the output follows, through
    the grammar; ``output_config.effort`` is the thinking level (``effort_of``)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidRequest("output_config must be an object")
    fmt = raw.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise InvalidRequest(
            'output_config.format must be {"type": "json_schema", "schema": {...}}'
        )
    if not isinstance(fmt.get("schema"), dict):
        raise invalid_format(fmt.get("schema"))
    return parse_format(fmt["schema"], "output_config.format.schema")


def tool_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where} must be a non-empty string")
    checked(TOOL_NAME.check, where, len(value))
    return value


def tools_of(raw: Any) -> list[dict[str, Any]] | None:
    """Custom tools (``name``, ``description``, ``input_schema``); server
    tools are refused."""
    return named_tools_field(raw, _custom_tool)


def _custom_tool(i: int, tool: dict[str, Any]) -> tuple[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise InvalidRequest(
            f"tools[{i}]: {str(tool['type'])[:64]!r} is a server tool, which this server "
            "does not run; only custom tools (name, description, input_schema) are supported"
        )
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(f"tools[{i}].input_schema must be a JSON Schema object")
    return tool_name(tool.get("name"), f"tools[{i}].name"), schema


def tool_choice_of(raw: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, bool | None]:
    """``tool_choice`` as the runner takes it, and whether calls may come
    in parallel (Anthropic's default, unless ``disable_parallel_tool_use``)."""
    if raw is None:
        return None, True if tools else None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (*CHOICES, "tool"):
        raise InvalidRequest('tool_choice.type must be "auto", "any", "tool" or "none"')
    disable = raw.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise InvalidRequest("tool_choice.disable_parallel_tool_use must be a boolean")
    if kind in ("any", "tool") and not tools:
        raise InvalidRequest(f'tool_choice "{kind}" needs tools')
    if kind != "tool":
        return CHOICES[kind], not disable
    name = tool_name(raw.get("name"), "tool_choice.name")
    if name not in {t["function"]["name"] for t in tools or []}:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools")
    return {"name": name}, not disable


def system_messages(raw: Any, blocks: Blocks) -> list[dict[str, Any]]:
    """``system``: a string or text blocks, as one system message."""
    if raw is None:
        return []
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, list):
        blocks.add(len(raw))
        texts = []
        for i, block in enumerate(raw):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise InvalidRequest(f"system[{i}] must be a text block")
            texts.append(block_text(block, f"system[{i}]"))
        text = "\n\n".join(texts)
    else:
        raise InvalidRequest("system must be a string or a list of text blocks")
    checked(SYSTEM_BYTES.check, "system", len(text.encode("utf-8", "surrogatepass")))
    return [{"role": "system", "content": text}] if text else []


def block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.text must be a string")
    return text


def content_blocks(content: Any, where: str, blocks: Blocks) -> list[dict[str, Any]]:
    """A message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of content blocks")
    blocks.add(len(content))
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}[{j}] must be a content block with a type")
    return content


def chat_messages(body: dict[str, Any], blocks: Blocks) -> list[dict[str, Any]]:
    """``messages`` as chat messages: a user turn's tool results become tool
    messages (named by the assistant's tool_use they answer), then its text
    and images one user message; an assistant turn is one message with its
    thinking and tool calls."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages must be a non-empty list")
    names: dict[str, str] = {}  # tool_use id -> tool name
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(f'messages[{i}].role must be "user" or "assistant"')
        where = f"messages[{i}].content"
        content = content_blocks(message.get("content"), where, blocks)
        if role == "user":
            chat.extend(user_turn(content, where, names))
        else:
            chat.append(assistant_turn(content, where, names))
    return chat


def user_turn(
    content: list[dict[str, Any]], where: str, names: dict[str, str]
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    images: list[str] = []
    for j, block in enumerate(content):
        at, kind = f"{where}[{j}]", block["type"]
        if kind == "text":
            texts.append(block_text(block, at))
        elif kind == "image":
            images.append(image_of(block, at))
        elif kind == "tool_result":
            results.append(tool_result(block, at, names))
        else:
            raise unsupported(at, kind, USER_BLOCKS)
    user: dict[str, Any] = {"role": "user", "content": "\n\n".join(texts)}
    if images:
        user["images"] = images
    return [*results, user] if texts or images or not results else results


def unsupported(where: str, kind: str, which: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {kind[:64]!r} blocks are not supported ({which})")


def image_of(block: dict[str, Any], where: str) -> str:
    """An image block's base64 source, checked as every image is; this
    server never fetches a URL."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind in ("url", "file"):
        raise InvalidRequest(
            f"{where}.source: this server does not fetch images ({kind} sources); "
            'send the image itself: {"type": "base64", "media_type": "image/png", "data": ...}'
        )
    if kind != "base64":
        raise InvalidRequest(f'{where}.source must be {{"type": "base64", "media_type", "data"}}')
    media_type = source.get("media_type")
    if not isinstance(media_type, str) or not media_type.startswith("image/"):
        raise InvalidRequest(f"{where}.source.media_type must be an image type (image/png, ...)")
    return checked(parse_image, source.get("data"), f"{where}.source.data")


def tool_result(block: dict[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    """A ``tool_result`` block as a tool message (its images kept)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"{where}.tool_use_id must be a non-empty string")
    content = block.get("content", "")
    texts, images = [], []
    for j, part in enumerate([] if isinstance(content, str) else content_list(content, where)):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
            raise InvalidRequest(f"{at} must be a text or image block")
        if part["type"] == "text":
            texts.append(block_text(part, at))
        else:
            images.append(image_of(part, at))
    text = content if isinstance(content, str) else "\n\n".join(texts)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidRequest(f"{where}.is_error must be a boolean")
    message: dict[str, Any] = {
        "role": "tool",
        "content": f"Error: {text}" if is_error else text,
        "tool_call_id": call_id,
    }
    if call_id in names:
        message["tool_name"] = names[call_id]
    if images:
        message["images"] = images
    return message


def content_list(content: Any, where: str) -> list[Any]:
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of text and image blocks")
    return content


def assistant_turn(
    content: list[dict[str, Any]], where: str, names: dict[str, str]
) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at, kind = f"{where}[{j}]", block["type"]
        if kind == "text":
            texts.append(block_text(block, at))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise InvalidRequest(f"{at}.thinking must be a string")
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            call_id = block.get("id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(f"{at}.id must be a non-empty string")
            if not isinstance(block.get("input"), dict):
                raise InvalidRequest(f"{at}.input must be an object")
            names[call_id] = tool_name(block.get("name"), f"{at}.name")
            function = {"name": names[call_id], "arguments": block["input"]}
            calls.append({"id": call_id, "function": function})
        elif kind != "redacted_thinking":  # encrypted by Anthropic: nothing a local model reads
            raise unsupported(at, kind, ASSISTANT_BLOCKS)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        message["thinking"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


# -- a generation -> Anthropic's objects ----------------------------------------------------


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    """A finished tool call as a ``tool_use`` block."""
    call_id = call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"
    return {
        "type": "tool_use",
        "id": call_id,
        "name": call["name"],
        "input": call.get("arguments", {}),
    }


def stop_of(f: Finished, called: bool) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``."""
    if called:
        return "tool_use", None
    if f.done_reason == "length":
        return "max_tokens", None
    if f.stop_sequence:
        return "stop_sequence", f.stop_sequence
    return "end_turn", None


def usage(f: Finished) -> dict[str, int]:
    return {"input_tokens": f.prompt_eval_count, "output_tokens": f.eval_count}


def message(model: str, reply: Reply) -> dict[str, Any]:
    """A ``message``: the whole answer, thinking first, then text, then tool calls."""
    content: list[dict[str, Any]] = []
    if reply.thinking:
        content.append({"type": "thinking", "thinking": reply.thinking, "signature": ""})
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    content.extend(tool_use(call) for call in reply.tool_calls)
    reason, sequence = stop_of(reply.finished, bool(reply.tool_calls))
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(reply.finished),
    }


@dataclass
class MessageEvents:
    """A stream's events as Anthropic's: ``message_start``, each block
    opened, filled with deltas and stopped (thinking, text, tool_use), then
    ``message_delta`` (stop reason, usage) and ``message_stop``."""

    model: str
    started: bool = False
    index: int = -1  # the last block opened
    open: str = ""  # the kind of the block open now ("thinking", "text"), or none
    called: bool = False
    out: list[dict[str, Any]] = field(default_factory=list)

    def batch(self, events: list[Event]) -> list[dict[str, Any]]:
        if not self.started:
            self.started = True
            self.out.append(self.start())
        route_events(
            events,
            lambda text: self.delta("text", {"type": "text_delta", "text": text}),
            lambda text: self.delta("thinking", {"type": "thinking_delta", "thinking": text}),
            self.tool_call,
            self.finish,
        )
        out, self.out = self.out, []
        return out

    def start(self) -> dict[str, Any]:
        head = {"id": message_id(), "type": "message", "role": "assistant", "model": self.model}
        body = {"content": [], "stop_reason": None, "stop_sequence": None}
        usage = {"input_tokens": 0, "output_tokens": 0}  # the real counts come in message_delta
        return {"type": "message_start", "message": {**head, **body, "usage": usage}}

    def open_block(self, block: dict[str, Any]) -> None:
        self.close_block()
        self.index += 1
        self.open = block["type"]
        self.out.append(
            {"type": "content_block_start", "index": self.index, "content_block": block}
        )

    def close_block(self) -> None:
        if self.open == "thinking":  # its signature: empty, no one signs a local model's thoughts
            delta = {"type": "signature_delta", "signature": ""}
            self.out.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        if self.open:
            self.out.append({"type": "content_block_stop", "index": self.index})
        self.open = ""

    def delta(self, kind: str, delta: dict[str, Any]) -> None:
        if self.open != kind:
            self.open_block(dict(EMPTY[kind]))
        self.out.append({"type": "content_block_delta", "index": self.index, "delta": delta})

    def tool_call(self, call: dict[str, Any]) -> None:
        self.called = True
        block = tool_use(call)
        arguments = json.dumps(block["input"])
        self.open_block({**block, "input": {}})
        delta = {"type": "input_json_delta", "partial_json": arguments}
        self.out.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        self.close_block()

    def finish(self, f: Finished) -> None:
        self.close_block()
        reason, sequence = stop_of(f, self.called)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        self.out.append({"type": "message_delta", "delta": delta, "usage": usage(f)})
        self.out.append({"type": "message_stop"})
