"""A chat history with tool calls and tool results, in the shape the chat
templates render.

Clients send it two ways:

- OpenAI: an assistant message's ``tool_calls`` are
  ``{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}``
  and a ``tool`` message names its call by ``tool_call_id``;
- Ollama: ``tool_calls`` are ``{"function": {"name", "arguments": {...}}}``
  (an id optional) and a ``tool`` message names the tool by ``tool_name``.

The templates want one shape: ``tool_calls`` entries with ``id``, ``type``
and ``function.arguments`` as an object (most apply ``tojson`` to it; a few
concatenate it as text, which ``ToolArguments`` allows too), and a ``tool``
message carrying both ``tool_call_id`` and the tool's ``name``. Each tool
result is matched to its call, by id, by name, or else in order. Mistral's
templates insist on ids of nine letters and digits; other ids are mapped
onto such ids, the same way in the call and in its result.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from jupyter_llm.chat_formats.call_readers import decode_arguments
from jupyter_llm.chat_formats.detect import ChatFormat

_ALNUM_9 = re.compile(r"[A-Za-z0-9]{9}")


class ToolArguments(dict[str, Any]):
    """A call's arguments: an object to ``tojson`` and iterate, and its JSON
    text where a template adds it to a string or prints it."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return str(self) + other
        return NotImplemented

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other + str(self)
        return NotImplemented


def template_messages(messages: list[dict[str, Any]], fmt: ChatFormat) -> list[dict[str, Any]]:
    """``messages`` (either API's shape, roles already checked) as the
    template expects them. Raises ``ValueError`` naming the field for a
    tool call that is not one."""
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # the latest assistant turn's calls, not yet answered
    for i, message in enumerate(messages):
        message = dict(message)
        role = message.get("role")
        if message.get("content") is None:
            message["content"] = ""
        _copy_thinking(message)
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                _call(i, j, c, fmt) for j, c in enumerate(_calls_list(i, message["tool_calls"]))
            ]
            message["tool_calls"] = calls
            pending = list(calls)
            if fmt.tool_calls == "deepseek_r1" and not message["content"]:
                message["content"] = None  # its templates render the calls only then
            if fmt.thinking == "harmony" and message.get("thinking") and message["content"]:
                message.pop("content")  # harmony takes one or the other before a call
        elif role == "assistant":
            message.pop("tool_calls", None)
        elif role == "tool":
            message.update(_result(i, message, pending, fmt))
        out.append(message)
    return out


def place_images(
    messages: list[dict[str, Any]], marker: Callable[[int], str]
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Each message's ``images`` as markers before its text: the chat's
    ``k``-th image (in message order) becomes ``marker(k)``, which the
    runner turns back into that image after the template has rendered the
    text. Returns the messages, without ``images``, and the images in
    order. ``ValueError`` for images beside content that is not text."""
    out: list[dict[str, Any]] = []
    images: list[Any] = []
    for i, message in enumerate(messages):
        message = dict(message)
        found = message.pop("images", None) or []
        if found:
            content = message.get("content")
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be text beside images")
            markers = "".join(marker(len(images) + j) for j in range(len(found)))
            message["content"] = markers + content
            images.extend(found)
        out.append(message)
    return out, images


def _copy_thinking(message: dict[str, Any]) -> None:
    """Ollama's ``thinking`` and OpenAI-style ``reasoning_content`` are the
    same thing; templates read one or the other."""
    thinking = message.get("thinking") or message.get("reasoning_content")
    if message.get("role") == "assistant" and isinstance(thinking, str) and thinking:
        message["thinking"] = message["reasoning_content"] = thinking
    else:
        message.pop("thinking", None)
        message.pop("reasoning_content", None)


def _calls_list(i: int, calls: Any) -> list[Any]:
    if not isinstance(calls, list):
        raise ValueError(f"messages[{i}].tool_calls must be a list")
    return calls


def _call(i: int, j: int, call: Any, fmt: ChatFormat) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}]"
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ValueError(f"{where} must be an object with a function")
    function = call["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    arguments = decode_arguments(function.get("arguments"))
    if arguments is None:
        raise ValueError(f"{where}.function.arguments must be an object or its JSON text")
    call_id = call.get("id") or function.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{i}_{j}"  # the same every time the history is sent, so the prompt caches
    return {
        "id": _template_id(call_id, fmt),
        "type": "function",
        "function": {"name": name, "arguments": ToolArguments(arguments)},
    }


def _result(
    i: int, message: dict[str, Any], pending: list[dict[str, Any]], fmt: ChatFormat
) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    call_id = message.get("tool_call_id")
    name = message.get("tool_name") or message.get("name")
    if call_id is not None and not isinstance(call_id, str):
        raise ValueError(f"messages[{i}].tool_call_id must be a string")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"messages[{i}].tool_name must be a string")
    match = None
    if call_id:
        call_id = _template_id(call_id, fmt)
        match = next((c for c in pending if c["id"] == call_id), None)
    elif name:
        match = next((c for c in pending if c["function"]["name"] == name), None)
    elif pending:
        match = pending[0]
    if match is not None:
        pending.remove(match)
        call_id = call_id or match["id"]
        name = name or match["function"]["name"]
    result: dict[str, Any] = {"content": content}
    if call_id:
        result["tool_call_id"] = call_id
    if name:
        result["name"] = result["tool_name"] = name
    return result


def _template_id(call_id: str, fmt: ChatFormat) -> str:
    if fmt.tool_call_id_length != 9 or _ALNUM_9.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]
