"""The one settings object: built once (from traitlets config and JUPYTER_LLM_* env
vars) and passed to everything that needs it."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from jupyter_llm.durations import parse_duration
from jupyter_llm.errors import ConfigError

DEFAULT_MODELS_DIR = Path("~/.jupyter_llm/models")


@dataclass(frozen=True)
class Settings:
    """Server-wide settings. Durations are seconds; sizes are bytes."""

    models_dir: Path = DEFAULT_MODELS_DIR
    keep_alive: float = 300.0  # negative: forever
    context_length: int = 4096
    max_loaded_models: int = 0  # 0: 3 x GPUs, at least 3
    num_parallel: int = 1
    max_queue: int = 512
    gpu_overhead: int = 0
    new_estimates: bool = False
    load_timeout: float = 300.0
    num_threads: int = 0  # 0: llama.cpp chooses
    stream_interval: float = 0.1  # seconds a fast model's tokens are grouped for streaming
    python: str = ""  # interpreter for runner processes; "" = this one

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then JUPYTER_LLM_* environment variables, then explicit overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"JUPYTER_LLM_{ENV_NAMES.get(f.name, f.name.upper())}")
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, raw)
        for name, value in overrides.items():
            if value is not None:
                values[name] = parse_duration(value, name) if name in DURATIONS else value
        settings = replace(cls(), **values)
        return replace(settings, models_dir=Path(settings.models_dir).expanduser())


ENV_NAMES = {"models_dir": "MODELS"}
DURATIONS = ("keep_alive", "load_timeout")  # seconds or "5m"; negative: forever


def _parse(name: str, raw: str) -> Any:
    kind = {f.name: f.type for f in fields(Settings)}[name]
    env_name = f"JUPYTER_LLM_{ENV_NAMES.get(name, name.upper())}"
    try:
        if name in DURATIONS:
            return parse_duration(raw)
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "Path":
            return Path(raw)
        return raw
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{env_name}={raw!r} is not a valid {kind}") from e


def _is_number(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True
