"""Chat messages: the roles and the one validator both APIs use.

Replaces ``ChatRequest.parse``'s loop (``api/requests.py``) and
``chat_messages`` (``api/openai.py``); ``ROLES`` moved here from
``api/requests.py``. Errors are plain ``ValueError``s naming the field;
``api/requests.py`` turns them into 400s.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")
OPENAI_ROLES = {"developer": "system"}  # OpenAI's extra roles, as the template knows them


def parse_messages(raw: Any, *, openai: bool = False) -> list[dict[str, Any]]:
    """``[{"role", "content"}]`` for the chat template, from untrusted JSON.

    Ollama's messages may be empty (the request then only loads the model)
    and keep their ``tool_calls``. With ``openai``, the list must not be
    empty, ``developer`` means ``system`` and content may be a list of text
    parts.
    """
    if openai and (not isinstance(raw, list) or not raw):
        raise ValueError("messages must be a non-empty list")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("messages must be a list of messages")
    roles = {**{r: r for r in ROLES}, **(OPENAI_ROLES if openai else {})}
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object")
        role = roles.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(roles)}")
        message = {"role": role, "content": _content(m.get("content"), i, openai)}
        if not openai and "tool_calls" in m:
            message["tool_calls"] = m["tool_calls"]
        messages.append(message)
    return messages


def _content(content: Any, i: int, parts: bool) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not parts:
        raise ValueError(f"messages[{i}].content must be a string")
    if not isinstance(content, list):
        raise ValueError(f"messages[{i}].content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise ValueError(f"messages[{i}].content: only text parts are supported")
        text = part.get("text", "")
        if not isinstance(text, str):
            raise ValueError(f"messages[{i}].content[{j}].text must be a string")
        texts.append(text)
    return "".join(texts)
