"""Ollama's options, the one table both APIs validate against.

``OPTION_TYPES`` and ``SAMPLING_OPTIONS`` (Ollama's options) and
``OPENAI_FIELDS`` (OpenAI's sampling fields, with their ranges) live outside
HTTP code so that the Modelfile parser, the Ollama handlers and the OpenAI
handlers share them. Errors are plain
``ValueError``s whose message names the field; ``api/requests.py`` turns them
into 400s.

A model's own parameters (a pulled manifest's params layer) pass the same
checks through ``model_params``, which drops what a request would have
refused instead of failing, so a hostile registry cannot make a model
unusable.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

from jupyter_llm.request.limits import DRAFT_TOKENS, REPEAT_LAST_N, check_stops

log = logging.getLogger(__name__)

MAX_CONTEXT = REPEAT_LAST_N.value  # 1 Mi tokens
INT_LIMIT = 1 << 63  # integers are 64-bit signed at most; Python's are not bounded
_NUM = (int, float)


class Option(NamedTuple):
    """An option's JSON type(s) and inclusive range (``None``: unbounded)."""

    kind: Any
    low: float | None = None
    high: float | None = None


# Ollama's Options (api/types.go ``Options`` and ``Runner``). Known but unused
# ones are accepted, as Ollama does, so existing clients keep working. Names
# Ollama no longer knows (``tfs_z``, ``penalize_newline``, ``numa``,
# ``low_vram``, ``use_mlock``, ``vocab_only``) are unknown here too: ignored
# with a warning. ``mirostat*`` left Ollama's table but llama.cpp still has
# them, so they stay and work.
OPTION_TYPES: dict[str, Option] = {
    "num_predict": Option(int, -2),
    "temperature": Option(_NUM, 0),
    "seed": Option(int),
    "top_k": Option(int, 0),
    "top_p": Option(_NUM, 0, 1),
    "min_p": Option(_NUM, 0, 1),
    "typical_p": Option(_NUM, 0, 1),
    "repeat_penalty": Option(_NUM, 0),
    "repeat_last_n": Option(int, -1, REPEAT_LAST_N.value),  # and at most num_ctx (runner)
    "presence_penalty": Option(_NUM),
    "frequency_penalty": Option(_NUM),
    "stop": Option((str, list)),
    "num_ctx": Option(int, 1, MAX_CONTEXT),
    "num_batch": Option(int, 1, MAX_CONTEXT),
    "num_thread": Option(int, 0, 1024),
    "num_gpu": Option(int, -1),
    "main_gpu": Option(int, 0),
    "use_mmap": Option(bool),
    "num_keep": Option(int, -1),
    # prompt-lookup drafts per step (runner.speculative); 0: no speculation
    "draft_num_predict": Option(int, 0, DRAFT_TOKENS.value),
    # ours: /api/chat's tool_choice ("auto", "none", "required" or a tool's
    # name), here so that Ollama's clients can send it
    "tool_choice": Option(str),
    "mirostat": Option(int, 0, 2),
    "mirostat_tau": Option(_NUM),
    "mirostat_eta": Option(_NUM),
}

# What a request that sets nothing gets: Ollama's ``api.DefaultOptions()``
# (api/types.go), the per-request part. The load-time part (num_ctx from
# ``context_length``, num_batch 512, num_gpu -1 = decided by the scheduler,
# num_thread 0 = the runtime decides) is applied by the scheduler. mirostat is
# llama.cpp's default (off), as Ollama no longer has it.
DEFAULT_OPTIONS: dict[str, Any] = {
    "num_predict": -1,
    "num_keep": 4,
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_last_n": 64,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "seed": -1,
    "stop": [],
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "draft_num_predict": 4,  # speculative decoding by prompt lookup on by default
}

# The per-request part, as the runner takes it (the rest are load options).
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
    "num_keep",
    "draft_num_predict",
)

# The runner's defaults for each per-request option the client leaves out.
DEFAULT_SAMPLING: dict[str, Any] = {k: DEFAULT_OPTIONS[k] for k in SAMPLING_OPTIONS}


class OpenAIField(NamedTuple):
    """An OpenAI request field: the Ollama option it sets and OpenAI's own
    range, which replaces the option's where given."""

    option: str
    low: float | None = None
    high: float | None = None


# In order of precedence: the first of two fields for one option wins.
OPENAI_FIELDS: dict[str, OpenAIField] = {
    "temperature": OpenAIField("temperature", 0, 2),
    "top_p": OpenAIField("top_p"),
    "frequency_penalty": OpenAIField("frequency_penalty", -2, 2),
    "presence_penalty": OpenAIField("presence_penalty", -2, 2),
    "max_completion_tokens": OpenAIField("num_predict", 1),
    "max_tokens": OpenAIField("num_predict", 1),
    "seed": OpenAIField("seed"),
    "stop": OpenAIField("stop"),
}


def check_option(label: str, spec: Option, value: Any) -> Any:
    """``value`` if it has the type and range of ``spec``; else a ``ValueError``
    whose message starts with ``label`` (the field as the client wrote it)."""
    kind, low, high = spec
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError(f"{label} must be {_want(kind)}")
    if not isinstance(value, kind):
        raise ValueError(f"{label} must be {_want(kind)}")
    if isinstance(value, list):
        if not all(isinstance(s, str) for s in value):
            raise ValueError(f"{label} must be {_want(kind)}")
        return value
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"{label} must be between -2^63 and 2^63-1")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{label} must be a number, got NaN")
    if isinstance(value, float) and math.isinf(value):
        raise ValueError(f"{label} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{label} must be {_bounds(low, high)}, got {value!r}")
    return value


def _want(kind: Any) -> str:
    if kind == (str, list):
        return "a string or a list of strings"
    return {bool: "a boolean", int: "an integer"}.get(kind, "a number")


def _bounds(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {_number(low)}"
    if low is None:
        return f"at most {_number(high)}"
    return f"between {_number(low)} and {_number(high)}"


def _number(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else f"{x:g}"


def parse_options(raw: Any, field: str = "options") -> dict[str, Any]:
    """Ollama ``options`` (or ``parameters``): known names type- and
    range-checked, ``null`` values left out. Unknown names are ignored with
    one warning naming them all, as Ollama does; a known name with a bad
    value is a ``ValueError``."""
    options, unknown = split_options(raw, field)
    if unknown:
        log.warning("%s: ignoring unknown options: %s", field, _names(unknown))
    return options


def split_options(raw: Any, field: str = "options") -> tuple[dict[str, Any], list[str]]:
    """``parse_options`` without the log: the checked options and the
    unknown names, in the client's order."""
    if raw is None:
        return {}, []
    if not isinstance(raw, dict):
        raise ValueError(f"{field} must be an object")
    options: dict[str, Any] = {}
    unknown: list[str] = []
    for name, value in raw.items():
        spec = OPTION_TYPES.get(name)
        if spec is None:
            unknown.append(_printable(name))
        elif value is not None:
            label = f"{field}.{name}"
            options[name] = bounded(name, label, check_option(label, spec, _integral(spec, value)))
    return options, unknown


def bounded(name: str, label: str, value: Any) -> Any:
    """``value`` within the bounds ``limits`` sets on option ``name`` beyond
    its type and range (the stop strings' count and length)."""
    if name == "stop":
        check_stops([value] if isinstance(value, str) else value, label)
    return value


def _integral(spec: Option, value: Any) -> Any:
    """An integral float (``100.0``, as Python clients may write it) for an
    integer option is that integer; any other value is left to the check."""
    if spec.kind is int and isinstance(value, float) and value.is_integer():
        if -INT_LIMIT <= value < INT_LIMIT:
            return int(value)
    return value


def _names(names: list[str], most: int = 20) -> str:
    """Names for one log line, however many a client sent."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _printable(name: str) -> str:
    """A client's option name, safe for one log line."""
    text = name if len(name) <= 64 else name[:64] + "..."
    return text if text.isprintable() else repr(text)


def model_params(raw: Any, model: str) -> dict[str, Any]:
    """A model's parameters (from its manifest) as options: each one checked
    like a request's; unknown names and bad values dropped with a warning
    naming ``model`` (the unknown names in one). Integral floats count as
    integers, as Ollama writes them, and a ``stop`` string becomes a list."""
    if not isinstance(raw, dict):
        log.warning("model %s: its parameters are not an object; all ignored", model)
        return {}
    params: dict[str, Any] = {}
    unknown: list[str] = []
    for name, value in raw.items():
        spec = OPTION_TYPES.get(name)
        if spec is None:
            unknown.append(_printable(name))
        elif value is not None:
            try:
                params[name] = _param_value(name, spec, value)
            except ValueError as e:
                log.warning("model %s: parameter %s dropped: %s", model, name, e)
    if unknown:  # one line for them all, as for a request's options
        log.warning("model %s: ignoring unknown parameters: %s", model, _names(unknown))
    return params


def _param_value(name: str, spec: Option, value: Any) -> Any:
    value = _integral(spec, value)
    if name == "stop" and isinstance(value, str):
        value = [value]
    return bounded(name, name, check_option(name, spec, value))


# What Ollama's OpenAI layer (openai/openai.go, FromChatRequest and
# FromCompleteRequest) sets when the request leaves a field out: OpenAI's own
# defaults, not api.DefaultOptions. Everything else falls through to the
# model's parameters, then DEFAULT_OPTIONS.
OPENAI_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}


def openai_options(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's sampling fields of ``body`` as Ollama options, checked against
    the same table, with ``OPENAI_DEFAULTS`` where the request sets none."""
    options: dict[str, Any] = {}
    for key, (option, low, high) in OPENAI_FIELDS.items():
        value = body.get(key)
        if value is None or option in options:
            continue
        spec = OPTION_TYPES[option]
        if low is not None or high is not None:
            spec = spec._replace(low=low, high=high)
        value = bounded(option, key, check_option(key, spec, value))
        options[option] = [value] if option == "stop" and isinstance(value, str) else value
    if body.get("n") not in (None, 1):
        raise ValueError("n must be 1: one choice per request")
    return {**OPENAI_DEFAULTS, **options}


def sampling_options(options: dict[str, Any]) -> dict[str, Any]:
    """The per-request part of Ollama options, as the runner takes them."""
    return {k: options[k] for k in SAMPLING_OPTIONS if k in options}
