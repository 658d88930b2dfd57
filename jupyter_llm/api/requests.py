"""Request bodies: typed values out of untrusted JSON, every error naming its field.

Pure functions over parsed JSON; the handlers stay thin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.api.structured import OutputFormat, parse_format
from jupyter_llm.errors import InvalidRequest
from jupyter_llm.keep_alive import parse_keep_alive
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.scheduler import LoadOptions

MAX_CONTEXT = 1 << 20

# Ollama's Options: name -> (type, lowest, highest). Known but unused ones are
# accepted, as Ollama does, so existing clients keep working.
_NUM = (int, float)
OPTION_TYPES: dict[str, tuple[Any, float | None, float | None]] = {
    "num_predict": (int, -2, None),
    "temperature": (_NUM, 0, None),
    "seed": (int, None, None),
    "top_k": (int, 0, None),
    "top_p": (_NUM, 0, 1),
    "min_p": (_NUM, 0, 1),
    "typical_p": (_NUM, 0, 1),
    "repeat_penalty": (_NUM, 0, None),
    "repeat_last_n": (int, -1, None),
    "presence_penalty": (_NUM, None, None),
    "frequency_penalty": (_NUM, None, None),
    "stop": ((str, list), None, None),
    "num_ctx": (int, 1, MAX_CONTEXT),
    "num_batch": (int, 1, MAX_CONTEXT),
    "num_thread": (int, 0, 1024),
    "num_gpu": (int, -1, None),
    "main_gpu": (int, 0, None),
    "use_mmap": (bool, None, None),
    "num_keep": (int, -1, None),
    "penalize_newline": (bool, None, None),
    "numa": (bool, None, None),
    "low_vram": (bool, None, None),
    "use_mlock": (bool, None, None),
    "vocab_only": (bool, None, None),
    "tfs_z": (_NUM, None, None),
    "mirostat": (int, 0, 2),
    "mirostat_tau": (_NUM, None, None),
    "mirostat_eta": (_NUM, None, None),
}
SAMPLING_OPTIONS = (
    "typical_p",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "num_predict",
    "temperature",
    "seed",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "stop",
)


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"invalid JSON in request body: {e}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("request body must be a JSON object")
    return value


def _typed(body: dict[str, Any], key: str, kind: Any, what: str, default: Any = None) -> Any:
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


def parse_options(raw: Any, field: str = "options") -> dict[str, Any]:
    """Ollama ``options``: known names type- and range-checked, unknown names refused."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{field} must be an object")
    options: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in OPTION_TYPES:
            raise InvalidRequest(f"{field}.{name} is not a known option")
        if value is None:
            continue
        kind, low, high = OPTION_TYPES[name]
        if isinstance(value, bool) and kind is not bool:
            raise InvalidRequest(f"{field}.{name} must be a number")
        if not isinstance(value, kind):
            want = {bool: "a boolean", int: "an integer"}.get(kind, "a number")
            if name == "stop":
                want = "a string or a list of strings"
            raise InvalidRequest(f"{field}.{name} must be {want}")
        if name == "stop":
            if isinstance(value, list) and not all(isinstance(s, str) for s in value):
                raise InvalidRequest(f"{field}.stop must be a string or a list of strings")
        elif kind is not bool and (
            (low is not None and value < low) or (high is not None and value > high)
        ):
            bounds = f"at least {low:g}" if high is None else f"between {low:g} and {high:g}"
            raise InvalidRequest(f"{field}.{name} must be {bounds}, got {value!r}")
        options[name] = value
    return options


def load_options(options: dict[str, Any]) -> LoadOptions:
    """The load-time part of Ollama options."""
    return LoadOptions(
        num_ctx=options.get("num_ctx"),
        num_batch=options.get("num_batch"),
        num_thread=options.get("num_thread") or None,
        use_mmap=options.get("use_mmap"),
        num_gpu=options.get("num_gpu"),
        main_gpu=options.get("main_gpu"),
    )


def sampling_options(options: dict[str, Any]) -> dict[str, Any]:
    """The per-request part of Ollama options, as the runner takes them."""
    return {k: options[k] for k in SAMPLING_OPTIONS if k in options}


@dataclass
class CompletionRequest:
    """What /api/generate and /api/chat share."""

    model: ModelName
    stream: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None
    format: OutputFormat | None = None


def parse_keep_alive_field(body: dict[str, Any]) -> float | None:
    value = body.get("keep_alive")
    return None if value is None else parse_keep_alive(value)


def _common(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("images"):
        raise InvalidRequest("images are not supported: this server has no vision models yet")
    return {
        "model": parse_model_name(body.get("model")),
        "stream": _typed(body, "stream", bool, "a boolean", True),
        "options": parse_options(body.get("options")),
        "keep_alive": parse_keep_alive_field(body),
        "format": parse_format(body.get("format")),
    }


@dataclass
class GenerateRequest(CompletionRequest):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    template: str | None = None
    suffix: str | None = None
    context: list[int] | None = None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> GenerateRequest:
        context = _typed(body, "context", list, "a list of token ids")
        if context is not None and not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in context
        ):
            raise InvalidRequest("context must be a list of token ids (non-negative integers)")
        return cls(
            **_common(body),
            prompt=_typed(body, "prompt", str, "a string", ""),
            system=_typed(body, "system", str, "a string"),
            raw=_typed(body, "raw", bool, "a boolean", False),
            template=_typed(body, "template", str, "a string"),
            suffix=_typed(body, "suffix", str, "a string"),
            context=context,
        )


ROLES = ("system", "user", "assistant", "tool")


@dataclass
class ChatRequest(CompletionRequest):
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Any] | None = None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> ChatRequest:
        raw_messages = _typed(body, "messages", list, "a list of messages", [])
        messages = []
        for i, m in enumerate(raw_messages):
            if not isinstance(m, dict):
                raise InvalidRequest(f"messages[{i}] must be an object")
            role = m.get("role")
            if role not in ROLES:
                raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}")
            content = m.get("content", "")
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise InvalidRequest(f"messages[{i}].content must be a string")
            message = {"role": role, "content": content}
            if "tool_calls" in m:
                message["tool_calls"] = m["tool_calls"]
            messages.append(message)
        return cls(
            **_common(body),
            messages=messages,
            tools=_typed(body, "tools", list, "a list"),
        )


def parse_embed_input(value: Any, field: str = "input") -> list[str]:
    """A string or a list of strings (an empty list is allowed: it only loads)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidRequest(f"{field} must be a string or a list of strings")


@dataclass
class EmbedRequest:
    model: ModelName
    inputs: list[str]
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None

    @classmethod
    def parse(cls, body: dict[str, Any], input_field: str = "input") -> EmbedRequest:
        dimensions = _typed(body, "dimensions", int, "a positive integer")
        if dimensions is not None and dimensions < 1:
            raise InvalidRequest("dimensions must be a positive integer")
        raw_input = body.get(input_field)
        return cls(
            model=parse_model_name(body.get("model")),
            inputs=[] if raw_input is None else parse_embed_input(raw_input, input_field),
            truncate=_typed(body, "truncate", bool, "a boolean", True),
            dimensions=dimensions,
            options=parse_options(body.get("options")),
            keep_alive=parse_keep_alive_field(body),
        )
