"""Request fields: typed values out of untrusted JSON, every error naming its field.

Pure functions over parsed JSON, which both APIs' translations
(``api/ollama_shapes.py``, ``api/openai_shapes.py``) build on. This is the
edge where the HTTP-agnostic validators (``jupyter_llm.request.options``,
``jupyter_llm.request.messages``, ``jupyter_llm.request.durations``) meet HTTP: their
``ValueError`` becomes an ``InvalidRequest`` (400) in ``checked``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jupyter_llm.chat_formats.detect import THINK_LEVELS, check_think
from jupyter_llm.chat_formats.tool_grammar import CHOICES as TOOL_CHOICES
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.request import untrusted_json
from jupyter_llm.request.durations import parse_duration
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import EMBED_INPUTS, TOOL_NAME
from jupyter_llm.request.messages import parse_messages
from jupyter_llm.request.options import (
    OPTION_TYPES as OPTION_TYPES,  # re-exported for the fuzz test
)
from jupyter_llm.request.options import openai_options, parse_options
from jupyter_llm.request.priority import parse_priority

T = TypeVar("T")


def checked(validate: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a pure validator; its ``ValueError`` is the 400 the client reads."""
    try:
        return validate(*args, **kwargs)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None


def options_field(raw: Any, field: str = "options") -> dict[str, Any]:
    """Ollama ``options`` (or ``/api/create``'s ``parameters``)."""
    return checked(parse_options, raw, field)


def openai_options_field(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's sampling fields, as Ollama options."""
    return checked(openai_options, body)


def messages_field(raw: Any, *, openai: bool = False) -> list[dict[str, Any]]:
    return checked(parse_messages, raw, openai=openai)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a bounded JSON object (``untrusted_json``); a 400 if not."""
    return checked(untrusted_json.parse_json_object, body)


def typed_field(body: dict[str, Any], key: str, kind: Any, what: str, default: Any = None) -> Any:
    """``body[key]`` if it is a ``kind`` (never a boolean for a number), else
    the 400 "``key`` must be ``what``"; ``default`` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) and kind is not bool and bool not in _as_tuple(kind):
        raise InvalidRequest(f"{key} must be {what}")
    if not isinstance(value, kind):
        raise InvalidRequest(f"{key} must be {what}")
    return value


def _as_tuple(kind: Any) -> tuple[Any, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def keep_alive_field(body: dict[str, Any]) -> float | None:
    value = body.get("keep_alive")
    return None if value is None else checked(parse_duration, value, "keep_alive")


def priority_field(body: dict[str, Any]) -> str | None:
    """``priority``: "interactive" or "batch" (``request.priority``); None if absent."""
    return checked(parse_priority, body.get("priority"))


MAX_TOP_LOGPROBS = 20  # OpenAI's and Ollama's bound


def logprobs_field(logprobs: Any, top: Any, top_field: str = "top_logprobs") -> int | None:
    """``logprobs`` (a boolean) and ``top_logprobs`` (0 to 20) as one value:
    ``None`` for none, else the number of alternatives each token reports."""
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidRequest("logprobs must be a boolean")
    top = integer_between(top, top_field, 0, MAX_TOP_LOGPROBS)
    if not logprobs:
        return None
    return top or 0


MAX_LEGACY_LOGPROBS = 5  # OpenAI's bound on /v1/completions


def legacy_logprobs_field(value: Any) -> int | None:
    """``/v1/completions``' ``logprobs``: ``None`` for none, else the number
    of alternatives each token reports (0 to 5)."""
    return integer_between(value, "logprobs", 0, MAX_LEGACY_LOGPROBS)


def integer_between(value: Any, field: str, low: int, high: int) -> int | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
    ):
        raise InvalidRequest(f"{field} must be an integer between {low} and {high}")
    return value


def think_field(value: Any) -> bool | str | None:
    """Ollama's ``think``: true, false, or a level (gpt-oss's effort)."""
    checked(check_think, value)
    return value


def reasoning_field(body: dict[str, Any]) -> bool | str | None:
    """OpenAI's ``reasoning_effort`` (or ``reasoning.effort``) as ``think``,
    as Ollama maps it: a level, or ``"none"`` for no thinking."""
    effort = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if effort is None and isinstance(reasoning, dict):
        effort = reasoning.get("effort")
    if effort is None:
        return None
    if effort == "none":
        return False
    if effort in THINK_LEVELS:
        return effort
    if isinstance(effort, str) and effort in EFFORT_CLAMPED:
        return EFFORT_CLAMPED[effort]
    efforts = ", ".join(f'"{e}"' for e in ("none", *THINK_LEVELS, *EFFORT_CLAMPED))
    raise InvalidRequest(f"reasoning_effort must be one of {efforts}")


# OpenAI's efforts past our levels' ends, and clients' own tiers, as the
# nearest level (Ollama's clamp): a 400 for an effort the client's own types
# allow would break it
EFFORT_CLAMPED = {"minimal": "low", "xhigh": "max", "ultra": "max"}


def tools_field(raw: Any) -> list[dict[str, Any]] | None:
    """Tools as both APIs send them: ``{"type": "function", "function":
    {"name", "description", "parameters"}}``; an empty list is none."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest("tools must be a list")
    tools = []
    for i, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise InvalidRequest(f"tools[{i}].function must be an object")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidRequest(f"tools[{i}].function.name must be a non-empty string")
        checked(TOOL_NAME.check, f"tools[{i}].function.name", len(function["name"]))
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequest(f"tools[{i}].function.parameters must be a JSON Schema object")
        tools.append({**tool, "type": tool.get("type", "function")})
    from jupyter_llm.api.structured import check_tools

    check_tools(tools)  # one grammar holds them all: format's limits, and TOOLS
    return tools or None


def named_tools_field(
    raw: Any, read: Callable[[int, dict[str, Any]], tuple[str, Any]]
) -> list[dict[str, Any]] | None:
    """Tools of the APIs that name a function at the top level (Responses,
    Anthropic) as the tools every API shares. ``read(i, tool)`` gives the
    tool's name and JSON Schema, or refuses a tool this server cannot run."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest("tools must be a list")
    functions = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise InvalidRequest(f"tools[{i}] must be an object")
        name, parameters = read(i, tool)
        description = tool.get("description") or ""
        if not isinstance(description, str):
            raise InvalidRequest(f"tools[{i}].description must be a string")
        function = {"name": name, "description": description, "parameters": parameters}
        functions.append({"type": "function", "function": function})
    return tools_field(functions)


def tool_choice_field(value: Any, tools: list[dict[str, Any]] | None) -> Any:
    """OpenAI's ``tool_choice`` as the runner takes it: "auto", "none",
    "required" or ``{"name": ...}`` naming one of ``tools``."""
    if value is None:
        return None
    if value in TOOL_CHOICES:
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest(
            'tool_choice must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    if name not in {t["function"]["name"] for t in tools or []}:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools")
    return {"name": name}


def parse_embed_input(value: Any, field: str = "input") -> list[str]:
    """A string or a list of strings (an empty list is allowed: it only loads),
    at most ``EMBED_INPUTS`` of them. Their total tokens (``EMBED_TOKENS``)
    are counted by the runner, where they are tokenized."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        checked(EMBED_INPUTS.check, field, len(value))
        return list(value)
    raise InvalidRequest(f"{field} must be a string or a list of strings")


@dataclass
class EmbedRequest:
    """An embedding request of either API (``parse``: Ollama's body)."""

    model: ModelName
    inputs: list[str]
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None
    encoding: str = "float"  # OpenAI's "base64": float32 strings, which the runner writes

    @classmethod
    def parse(cls, body: dict[str, Any], input_field: str = "input") -> EmbedRequest:
        dimensions = typed_field(body, "dimensions", int, "a positive integer")
        if dimensions is not None and dimensions < 1:
            raise InvalidRequest("dimensions must be a positive integer")
        raw_input = body.get(input_field)
        return cls(
            model=parse_model_name(body.get("model")),
            inputs=[] if raw_input is None else parse_embed_input(raw_input, input_field),
            truncate=typed_field(body, "truncate", bool, "a boolean", True),
            dimensions=dimensions,
            options=options_field(body.get("options")),
            keep_alive=keep_alive_field(body),
        )
