"""The one settings object: built once (from traitlets config and JUPYTER_LLM_* env
vars) and passed to everything that needs it.

Durations are parsed by ``jupyter_llm.request.durations``;
its ``ValueError`` becomes a ``ConfigError`` here that names the variable and
its value, and the app refuses to start with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jupyter_llm.request.durations import parse_duration
from jupyter_llm.request.errors import ConfigError

DEFAULT_MODELS_DIR = Path("~/.jupyter_llm/models")


@dataclass(frozen=True)
class Settings:
    """Server-wide settings. Durations are seconds; sizes are bytes."""

    models_dir: Path = DEFAULT_MODELS_DIR
    keep_alive: float = 300.0  # negative: forever
    context_length: int = 4096
    max_loaded_models: int = 0  # 0: 3 x GPUs, at least 3
    num_parallel: int = 4  # sequences per model, sharing one KV cache
    max_queue: int = 512
    max_requests_per_user: int = 0  # concurrent requests per user; 0: no limit (more queue)
    gpu_overhead: int = 0
    new_estimates: bool = False
    load_timeout: float = 300.0
    num_threads: int = 0  # 0: the physical cores the runner may use (runner/cpu_threads.py)
    stream_interval: float = 0.1  # seconds a fast model's tokens are grouped for streaming
    flash_attention: str = "auto"  # "auto" (llama.cpp's choice per backend), "on" or "off"
    kv_cache_type: str = "f16"  # "f16", "q8_0" or "q4_0" (quantized needs flash attention)
    # a token's logits independent of what else its decode holds (memory/kv_cache.py):
    # greedy output equal with and without drafts, for some prompt speed
    batch_invariant: bool = False
    # long prompt prefixes' KV state on disk (runner/prompt_disk.py): a byte budget for
    # the whole directory (0: off), how long an unused file is kept, and where ("": beside
    # the models, <models_dir>/prompt-cache)
    prompt_disk_cache: int = 1 << 30
    prompt_disk_expiry: float = 86400.0
    prompt_disk_dir: str = ""
    # a slot's long prefix kept in the runner's memory when another conversation takes
    # the slot (runner/prompt_ram.py): bytes per loaded model (0: off)
    prompt_ram_cache: int = 512 << 20
    python: str = ""  # interpreter for runner processes; "" = this one
    # a shared engine (``jupyter llm serve`` behind JupyterHub): this server then
    # starts no scheduler and forwards its ``/llm/`` routes there (``api.forward``)
    engine_url: str = ""
    engine_token: str = field(default="", repr=False)  # "": $JUPYTERHUB_API_TOKEN
    ray_address: str = ""  # a Ray cluster for the runners ("auto", "head:6379"); "": none
    hf_endpoint: str = "https://huggingface.co"  # Hugging Face (or a mirror) for hf.co/ pulls
    # token hosts trusted beside each registry's own, "host" or "host:port", comma-separated
    trusted_auth_hosts: str = ""
    # seconds between two samples of the sidebar's history (history/sampler.py); its
    # ring keeps 300 samples, so the default's window is ten minutes
    history_interval: float = 2.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then JUPYTER_LLM_* environment variables, then explicit
        overrides (``None``: not set). A bad value is a ``ConfigError`` naming
        the variable and the value."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = env_name(f.name)
            raw = env.get(name)
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, raw, name)
        for name, value in overrides.items():
            if value is not None:
                parsed = name in DURATIONS or name in CHOICES
                values[name] = _parse(name, value, name) if parsed else value
        settings = replace(cls(), **values)
        settings = replace(settings, models_dir=Path(settings.models_dir).expanduser())
        _check_prompt_disk(settings)
        _check_history_interval(settings)
        if settings.engine_url:
            return _with_engine(settings, env)
        return settings


def _with_engine(settings: Settings, env: Any) -> Settings:
    """The engine's URL checked and ending in "/"; its token, unless given, the
    Hub's token of this user's server (a user's server authenticates as its user)."""
    url = settings.engine_url
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise ConfigError(
            f"invalid {env_name('engine_url')}: {url!r}; expected an http(s) URL such as "
            "http://127.0.0.1:8765/services/llm/"
        )
    token = settings.engine_token or env.get("JUPYTERHUB_API_TOKEN", "")
    return replace(settings, engine_url=url.rstrip("/") + "/", engine_token=token)


def _check_prompt_disk(settings: Settings) -> None:
    """The prompt caches' budgets are 0 (off) or more, and the files expire."""
    if settings.prompt_disk_cache < 0:
        raise ConfigError(
            f"invalid {env_name('prompt_disk_cache')}: {settings.prompt_disk_cache}; "
            "expected a byte budget, 0 to turn the prompt cache on disk off"
        )
    if settings.prompt_ram_cache < 0:
        raise ConfigError(
            f"invalid {env_name('prompt_ram_cache')}: {settings.prompt_ram_cache}; "
            "expected a byte budget, 0 to turn the prompt cache in RAM off"
        )
    if not settings.prompt_disk_expiry > 0:
        raise ConfigError(
            f"invalid {env_name('prompt_disk_expiry')}: {settings.prompt_disk_expiry:g}; "
            'expected a positive duration such as "24h"'
        )


# the history sampler's interval: four samples a second at most (each reads the
# scheduler's figures and NVML in a thread), one a minute at least (300 samples: 5 hours)
HISTORY_INTERVAL_BOUNDS = (0.25, 60.0)


def _check_history_interval(settings: Settings) -> None:
    low, high = HISTORY_INTERVAL_BOUNDS
    if not low <= settings.history_interval <= high:
        raise ConfigError(
            f"invalid {env_name('history_interval')}: {settings.history_interval:g}; "
            f"expected a duration from {low:g} s to {high:g} s"
        )


def prompt_disk_dir(settings: Settings) -> Path:
    """Where the prompt cache's files go."""
    if settings.prompt_disk_dir:
        return Path(settings.prompt_disk_dir).expanduser()
    return Path(settings.models_dir) / "prompt-cache"


ENV_NAMES = {"models_dir": "MODELS"}
FOREIGN_ENV_NAMES = {
    "hf_endpoint": "HF_ENDPOINT"
}  # variables other tools read too, as they spell them
# seconds or "5m"; negative: forever (an expiry of 0 is refused)
DURATIONS = ("keep_alive", "load_timeout", "prompt_disk_expiry", "history_interval")
_BOOLS = {"1": True, "true": True, "yes": True, "on": True}
_BOOLS |= {"0": False, "false": False, "no": False, "off": False}
_SWITCH = {"auto": "auto"} | {k: "on" if v else "off" for k, v in _BOOLS.items()}
KV_CACHE_TYPES = {"f16": "f16", "q8_0": "q8_0", "q4_0": "q4_0"}  # Ollama's OLLAMA_KV_CACHE_TYPE
# fields of a few values, each with its spellings
CHOICES = {"flash_attention": _SWITCH, "kv_cache_type": KV_CACHE_TYPES}
_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (1/0, true/false, yes/no, on/off)",
}


def env_name(field: str) -> str:
    """The environment variable of a ``Settings`` field."""
    if field in FOREIGN_ENV_NAMES:
        return FOREIGN_ENV_NAMES[field]
    return f"JUPYTER_LLM_{ENV_NAMES.get(field, field.upper())}"


def _parse(name: str, raw: Any, label: str) -> Any:
    """``raw`` as the type of field ``name``; ``label`` is how the user wrote it."""
    kind = {f.name: f.type for f in fields(Settings)}[name]
    try:
        if name in DURATIONS:
            return parse_duration(raw, label)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        if name in CHOICES:
            return CHOICES[name][str(raw).lower()]
        if kind == "bool":
            return _BOOLS[raw.lower()]
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "Path":
            return Path(raw)
        return raw
    except (KeyError, TypeError, ValueError):
        expected = _one_of(CHOICES[name]) if name in CHOICES else _EXPECTED[kind]
        raise ConfigError(f"invalid {label}: {raw!r}; expected {expected}") from None


def _one_of(choices: dict[str, str]) -> str:
    """``a, b or c``: the values a choice field takes."""
    *first, last = dict.fromkeys(choices.values())
    return f"{', '.join(first)} or {last}"
