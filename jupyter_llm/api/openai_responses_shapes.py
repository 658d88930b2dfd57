"""OpenAI's Responses API shapes, translated to the one generation request.

Pure functions over parsed JSON, as ``api/openai_shapes.py`` is for chat
completions: a ``/v1/responses`` body becomes a ``ResponsesCall``. Its
``input`` items (messages with ``input_text``/``input_image`` parts,
``function_call`` and ``function_call_output`` items) become chat
completions' messages, which ``request/messages.py`` checks as it checks
every chat; a stored conversation (``previous_response_id``) goes before
them. The reply side is ``api/openai_responses_output.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.api.generation import GenerationRequest
from jupyter_llm.api.openai_shapes import parallel_field, stream_flag
from jupyter_llm.api.requests import (
    checked,
    messages_field,
    named_tools_field,
    openai_options_field,
    priority_field,
    reasoning_field,
    tool_choice_field,
    typed_field,
)
from jupyter_llm.api.structured import invalid_format, parse_format
from jupyter_llm.grammar.check import OutputFormat
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import (
    INPUT_ITEMS,
    INSTRUCTIONS_BYTES,
    METADATA_KEYS,
    RESPONSE_ID,
)

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
PARTS = "input_text, input_image and (assistant) output_text parts"
ITEMS = "message, function_call, function_call_output and reasoning items"


@dataclass
class ResponsesCall:
    """A ``/v1/responses`` body: the generation it asks for, how to answer,
    and what the response object echoes back."""

    generation: GenerationRequest
    chat: list[dict[str, Any]]  # this request's input as chat messages, without instructions
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    echo: dict[str, Any] = field(default_factory=dict)  # the request's settings, as OpenAI echoes


@dataclass
class Items:
    """Input items and parts counted across one request (``INPUT_ITEMS``),
    and the tool name of each call id seen (a tool message names its tool)."""

    seen: int = 0
    names: dict[str, str] = field(default_factory=dict)

    def add(self, n: int) -> None:
        self.seen += n
        checked(INPUT_ITEMS.check, "the request's input items", self.seen)


def identifier(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where} must be a non-empty string")
    checked(RESPONSE_ID.check, where, len(value))
    return value


def previous_id(body: dict[str, Any]) -> str | None:
    """``previous_response_id``, checked before anything is looked up."""
    raw = body.get("previous_response_id")
    return None if raw is None else identifier(raw, "previous_response_id")


def responses_call(body: dict[str, Any], history: list[dict[str, Any]]) -> ResponsesCall:
    """A ``/v1/responses`` body after ``history`` (the stored conversation of
    ``previous_response_id``, or none). Images are decoded, tool schemas
    checked and the grammar converted: call this off the event loop."""
    items = Items()
    for message in history:  # the stored calls name the tools of their outputs
        for call in message.get("tool_calls") or ():
            items.names[call["id"]] = call["function"]["name"]
    chat = input_messages(body.get("input"), items)
    system = instructions_of(body.get("instructions"))
    tools = tools_of(body.get("tools"))
    store = typed_field(body, "store", bool, "a boolean", True)
    request = GenerationRequest(
        model=parse_model_name(body.get("model")),
        options=options_of(body),
        messages=messages_field([*system, *history, *chat], openai=True),
        tools=tools,
        tool_choice=tool_choice_field(choice_of(body.get("tool_choice")), tools),
        parallel_tool_calls=parallel_field(body),
        think=reasoning_field({"reasoning": reasoning_of(body.get("reasoning"))}),
        format=text_format(body.get("text")),
        priority=priority_field(body),
    )
    echo = {
        "instructions": body.get("instructions"),
        "metadata": metadata_of(body.get("metadata")),
        "tools": [echoed(tool, TOOL_KEYS) for tool in body.get("tools") or []],
        "tool_choice": echoed_choice(body.get("tool_choice", "auto")),
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "temperature": request.options.get("temperature"),
        "top_p": request.options.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "text": {"format": echoed((body.get("text") or {}).get("format"), FORMAT_KEYS)},
        "store": store,
    }
    return ResponsesCall(request, chat, stream_flag(body), store, previous_id(body), echo)


# what the response object echoes of a tool and of text.format: the fields
# OpenAI's has, never others a client added (they would be written into every
# event that carries the response, and kept for GET)
TOOL_KEYS = ("type", "name", "description", "parameters", "strict")
FORMAT_KEYS = ("type", "name", "description", "schema", "strict")


def echoed(value: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``value``'s ``keys`` (a text format's type is "text" when none was sent)."""
    if not isinstance(value, dict):
        return {"type": "text"}
    return {key: value[key] for key in keys if key in value}


def echoed_choice(choice: Any) -> Any:
    """``tool_choice`` as it was read (``choice_of``): a word, or the function named."""
    if isinstance(choice, dict):
        return {"type": choice.get("type"), "name": choice.get("name")}
    return choice


def options_of(body: dict[str, Any]) -> dict[str, Any]:
    """``temperature``, ``top_p`` and ``max_output_tokens`` as Ollama options."""
    fields = {k: body.get(k) for k in ("temperature", "top_p")}
    fields["max_tokens"] = body.get("max_output_tokens")
    try:
        return openai_options_field(fields)
    except InvalidRequest as e:
        raise InvalidRequest(str(e).replace("max_tokens", "max_output_tokens")) from None


def reasoning_of(raw: Any) -> dict[str, Any] | None:
    if raw is not None and not isinstance(raw, dict):
        raise InvalidRequest("reasoning must be an object")
    return raw


def instructions_of(raw: Any) -> list[dict[str, Any]]:
    """``instructions``: one system message before everything (never stored)."""
    if raw is None:
        return []
    if not isinstance(raw, str):
        raise InvalidRequest("instructions must be a string")
    checked(INSTRUCTIONS_BYTES.check, "instructions", len(raw.encode("utf-8", "surrogatepass")))
    return [{"role": "system", "content": raw}] if raw else []


def metadata_of(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequest("metadata must be an object of strings")
    checked(METADATA_KEYS.check, "metadata", len(raw))
    for key, value in raw.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise InvalidRequest(
                "metadata keys must be up to 64 characters and values strings of up to 512 "
                f"({METADATA_KEYS.key})"
            )
    return raw


def tools_of(raw: Any) -> list[dict[str, Any]] | None:
    """Function tools (``{"type": "function", "name", "description",
    "parameters", "strict"}``); OpenAI's hosted tools (web search, file
    search, ...) are refused."""
    return named_tools_field(raw, _function_tool)


def _function_tool(i: int, tool: dict[str, Any]) -> tuple[str, Any]:
    if tool.get("type") != "function":
        raise InvalidRequest(
            f"tools[{i}]: {str(tool.get('type'))[:64]!r} tools are hosted by OpenAI and "
            "this server does not run them; only function tools are supported"
        )
    return identifier(tool.get("name"), f"tools[{i}].name"), tool.get("parameters") or {}


def choice_of(raw: Any) -> Any:
    """``tool_choice``: a word, or ``{"type": "function", "name"}``."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    if isinstance(raw, dict) and raw.get("type") == "allowed_tools":
        raise InvalidRequest("tool_choice allowed_tools is not supported; send those tools only")
    raise InvalidRequest(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}'
    )


def text_format(raw: Any) -> OutputFormat | None:
    """``text.format``: text (none), any JSON object, or a JSON Schema, through the grammar."""
    if raw is None:
        return None
    fmt = raw.get("format") if isinstance(raw, dict) else None
    if fmt is None and isinstance(raw, dict):
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise InvalidRequest('text.format must be {"type": "text" | "json_object" | "json_schema"}')
    if kind == "text":
        return None
    if kind == "json_object":
        return parse_format("json")
    if not isinstance(fmt.get("schema"), dict):
        raise invalid_format(fmt.get("schema"))
    return parse_format(fmt["schema"], "text.format.schema")


# -- input items -> chat completions' messages --------------------------------------------


def input_messages(raw: Any, items: Items) -> list[dict[str, Any]]:
    """``input``: a string (one user message) or a list of items. Function
    calls in a row join the assistant message before them."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("input must be a string or a non-empty list of items")
    items.add(len(raw))
    chat: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            joined(chat, message_of(item, where, items))
        elif kind == "function_call":
            call_of(item, where, items, chat)
        elif kind == "function_call_output":
            chat.append(output_of(item, where, items))
        elif kind == "reasoning":
            reasoning_item(item, where, chat)
        else:
            raise InvalidRequest(f"{where}: {str(kind)[:64]!r} items are not supported ({ITEMS})")
    return chat


def joined(chat: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append ``message``; an assistant's text after its reasoning item is one turn."""
    last = chat[-1] if chat else None
    if (
        message["role"] == "assistant"
        and last is not None
        and last["role"] == "assistant"
        and last["content"] == ""
        and "tool_calls" not in last
    ):
        last["content"] = message["content"]
    else:
        chat.append(message)


def message_of(item: dict[str, Any], where: str, items: Items) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {', '.join(ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of content parts")
    items.add(len(content))
    parts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise InvalidRequest(f"{at}.text must be a string")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and role != "assistant":
            if part.get("file_id") is not None or not isinstance(part.get("image_url"), str):
                raise InvalidRequest(
                    f"{at}.image_url must be a data: URL (data:image/png;base64,...); "
                    "this server has no files API and fetches no URLs"
                )
            parts.append({"type": "image_url", "image_url": part["image_url"]})
        else:
            raise InvalidRequest(f"{at}: {str(kind)[:64]!r} parts are not supported ({PARTS})")
    return {"role": role, "content": parts}


def call_of(item: dict[str, Any], where: str, items: Items, chat: list[dict[str, Any]]) -> None:
    """A ``function_call`` item: a tool call of the assistant message before it."""
    call_id = identifier(item.get("call_id"), f"{where}.call_id")
    name = identifier(item.get("name"), f"{where}.name")
    arguments = item.get("arguments", "")
    if not isinstance(arguments, str):
        raise InvalidRequest(f"{where}.arguments must be a string of JSON")
    items.names[call_id] = name
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    if not chat or chat[-1]["role"] != "assistant":
        chat.append({"role": "assistant", "content": ""})
    chat[-1].setdefault("tool_calls", []).append(call)


def output_of(item: dict[str, Any], where: str, items: Items) -> dict[str, Any]:
    """A ``function_call_output`` item as a tool message (its images kept)."""
    call_id = identifier(item.get("call_id"), f"{where}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        message = message_of({"role": "user", "content": output}, f"{where}.output", items)
        output = message["content"]
    elif not isinstance(output, str):
        raise InvalidRequest(f"{where}.output must be a string or a list of content parts")
    tool = {"role": "tool", "content": output, "tool_call_id": call_id}
    if call_id in items.names:
        tool["tool_name"] = items.names[call_id]
    return tool


def reasoning_item(item: dict[str, Any], where: str, chat: list[dict[str, Any]]) -> None:
    """A ``reasoning`` item sent back: its text is the next assistant turn's thinking."""
    texts = []
    for part in [*(item.get("content") or []), *(item.get("summary") or [])]:
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}: reasoning content and summary parts need a text")
        texts.append(part["text"])
    chat.append({"role": "assistant", "content": "", "reasoning": "\n".join(texts)})


def conversation_bytes(chat: list[dict[str, Any]]) -> int:
    """What a stored conversation costs, as ``STORED_BYTES`` counts it."""
    return len(json.dumps(chat))
