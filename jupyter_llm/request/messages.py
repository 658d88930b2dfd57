"""Chat messages: the roles and the one validator both APIs use.

Both APIs' chat bodies (Ollama's and OpenAI's) are checked here, outside HTTP
code, so that they accept the same messages. Errors are plain ``ValueError``s
naming the field; ``api/requests.py`` turns them into 400s.
"""

from __future__ import annotations

from typing import Any

from jupyter_llm.request.images import check_request_images, parse_image_url, parse_images
from jupyter_llm.request.limits import JSON_VALUES, SCHEMA_DEPTH
from jupyter_llm.request.untrusted_json import BodyError, Refused, check_tree, parse_json_text

ROLES = ("system", "user", "assistant", "tool")
# OpenAI's extra roles, as the template knows them (on Ollama's routes too,
# where a client built for OpenAI's sends them)
OPENAI_ROLES = {"developer": "system"}
ROLE_OF = {**{r: r for r in ROLES}, **OPENAI_ROLES}  # a role as written, lowercased


def parse_messages(raw: Any, *, openai: bool = False) -> list[dict[str, Any]]:
    """``[{"role", "content"}]`` for the chat template, from untrusted JSON.

    Ollama's messages may be empty (the request then only loads the model)
    and keep their ``tool_calls`` and ``images`` (base64, checked by
    ``jupyter_llm.request.images``). With ``openai``, the list must not be empty,
    ``developer`` means ``system`` and content may be a list of text and
    ``image_url`` parts (the images become the message's ``images``).
    """
    if openai and (not isinstance(raw, list) or not raw):
        raise ValueError("messages must be a non-empty list")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("messages must be a list of messages")
    messages = []
    arguments = [0]  # values in the tool calls' arguments so far (``_tool_calls``)
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object")
        role = ROLE_OF.get(m["role"].lower()) if isinstance(m.get("role"), str) else None
        if role is None:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLE_OF)}")
        content, images = _content(m.get("content"), i, openai)
        message: dict[str, Any] = {"role": role, "content": content}
        if not openai:
            images = parse_images(m.get("images"), f"messages[{i}].images")
        if images:
            message["images"] = images
        if m.get("tool_calls") is not None:
            message["tool_calls"] = _tool_calls(m["tool_calls"], i, arguments)
        for key, field in TEXT_FIELDS.items():
            value = m.get(key)
            if value is None or (key == "name" and role != "tool"):  # a participant's name
                continue
            if not isinstance(value, str):
                raise ValueError(f"messages[{i}].{key} must be a string")
            message.setdefault(field, value)
        messages.append(message)
    check_request_images([image for m in messages for image in m.get("images", ())])
    return messages


# optional text fields of a message, as the chat template receives them:
# Ollama's names, then OpenAI's for the same thing
TEXT_FIELDS = {
    "thinking": "thinking",
    "tool_name": "tool_name",
    "tool_call_id": "tool_call_id",
    "reasoning_content": "thinking",
    "reasoning": "thinking",
    "name": "tool_name",
}


def _tool_calls(raw: Any, i: int, spent: list[int]) -> list[dict[str, Any]]:
    """An assistant's tool calls in one shape whichever API sent them:
    ``{"type": "function", "function": {"name", "arguments": {...}}}`` plus
    ``id`` when given (OpenAI's arguments are JSON text, Ollama's an object).
    ``spent``: the values of the request's arguments so far, which together
    stay within ``JSON_VALUES``, as a body's own do (text in a body's strings,
    each argument alone within it: 3,000 of them held 6M values, 6 s of the
    server's time)."""
    if not isinstance(raw, list):
        raise ValueError(f"messages[{i}].tool_calls must be a list")
    calls = []
    for j, call in enumerate(raw):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ValueError(f"{where}.function must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.function.name must be a non-empty string")
        arguments = function.get("arguments")
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = parse_json_text(arguments, f"{where}.function.arguments")
            except Refused:
                raise
            except BodyError:
                raise ValueError(f"{where}.function.arguments must be a JSON object") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"{where}.function.arguments must be a JSON object")
        spent[0] += check_tree(arguments, f"{where}.function.arguments", SCHEMA_DEPTH.value)
        if spent[0] > JSON_VALUES.value:  # read at most the limit and one argument past it
            raise Refused(str(JSON_VALUES.exceeded("the tool calls' arguments", spent[0])))
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if call.get("id") is not None:
            if not isinstance(call["id"], str):
                raise ValueError(f"{where}.id must be a string")
            out["id"] = call["id"]
        calls.append(out)
    return calls


def _content(content: Any, i: int, parts: bool) -> tuple[str, list[str]]:
    """The message's text, and the images of its ``image_url`` parts."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not parts:
        raise ValueError(f"messages[{i}].content must be a string")
    if not isinstance(content, list):
        raise ValueError(f"messages[{i}].content must be a string or a list of parts")
    texts, images = [], []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            images.append(parse_image_url(part, f"messages[{i}].content[{j}]"))
            continue
        if kind != "text":
            raise ValueError(
                f"messages[{i}].content[{j}]: only text and image_url parts are supported"
            )
        text = part.get("text", "")
        if not isinstance(text, str):
            raise ValueError(f"messages[{i}].content[{j}].text must be a string")
        texts.append(text)
    return "".join(texts), images
