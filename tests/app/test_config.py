import math
from pathlib import Path

import pytest

from jupyter_llm.config import Settings
from jupyter_llm.request.errors import ConfigError


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({}, "keep_alive", 300.0),
        ({"JUPYTER_LLM_KEEP_ALIVE": "10m"}, "keep_alive", 600.0),
        ({"JUPYTER_LLM_KEEP_ALIVE": "-1"}, "keep_alive", math.inf),
        ({"JUPYTER_LLM_KEEP_ALIVE": "45"}, "keep_alive", 45.0),
        ({"JUPYTER_LLM_CONTEXT_LENGTH": "8192"}, "context_length", 8192),
        ({"JUPYTER_LLM_NEW_ESTIMATES": "1"}, "new_estimates", True),
        ({"JUPYTER_LLM_NEW_ESTIMATES": "false"}, "new_estimates", False),
        ({"JUPYTER_LLM_MODELS": "/tmp/m"}, "models_dir", Path("/tmp/m")),
        ({"JUPYTER_LLM_MAX_QUEUE": "7"}, "max_queue", 7),
        ({"JUPYTER_LLM_MAX_QUEUE": ""}, "max_queue", 512),
        # the README's table, as written
        ({"JUPYTER_LLM_KEEP_ALIVE": "1h30m"}, "keep_alive", 5400.0),
        ({"JUPYTER_LLM_LOAD_TIMEOUT": "5m"}, "load_timeout", 300.0),
        ({"JUPYTER_LLM_MODELS": "~/.ollama/models"}, "models_dir", Path.home() / ".ollama/models"),
        ({"JUPYTER_LLM_MAX_LOADED_MODELS": "0"}, "max_loaded_models", 0),
        ({"JUPYTER_LLM_NUM_PARALLEL": "1"}, "num_parallel", 1),
        ({"JUPYTER_LLM_NUM_THREADS": "0"}, "num_threads", 0),
        ({"JUPYTER_LLM_STREAM_INTERVAL": "0.1"}, "stream_interval", 0.1),
        ({"JUPYTER_LLM_GPU_OVERHEAD": "0"}, "gpu_overhead", 0),
        ({"JUPYTER_LLM_NEW_ESTIMATES": "0"}, "new_estimates", False),
        ({"JUPYTER_LLM_PYTHON": "/usr/bin/python3"}, "python", "/usr/bin/python3"),
        ({}, "flash_attention", "auto"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "auto"}, "flash_attention", "auto"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "on"}, "flash_attention", "on"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "off"}, "flash_attention", "off"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "true"}, "flash_attention", "on"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "1"}, "flash_attention", "on"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "False"}, "flash_attention", "off"),
        ({"JUPYTER_LLM_FLASH_ATTENTION": "0"}, "flash_attention", "off"),
        ({}, "kv_cache_type", "f16"),
        ({"JUPYTER_LLM_KV_CACHE_TYPE": "q8_0"}, "kv_cache_type", "q8_0"),
        ({"JUPYTER_LLM_KV_CACHE_TYPE": "Q4_0"}, "kv_cache_type", "q4_0"),
        ({"JUPYTER_LLM_KV_CACHE_TYPE": "f16"}, "kv_cache_type", "f16"),
        ({}, "hf_endpoint", "https://huggingface.co"),
        ({"HF_ENDPOINT": "https://mirror.example"}, "hf_endpoint", "https://mirror.example"),
        ({}, "trusted_auth_hosts", ""),
        ({"JUPYTER_LLM_TRUSTED_AUTH_HOSTS": "a.example"}, "trusted_auth_hosts", "a.example"),
        ({}, "history_interval", 2.0),
        ({"JUPYTER_LLM_HISTORY_INTERVAL": "500ms"}, "history_interval", 0.5),
        ({"JUPYTER_LLM_HISTORY_INTERVAL": "0.25"}, "history_interval", 0.25),  # the bounds
        ({"JUPYTER_LLM_HISTORY_INTERVAL": "1m"}, "history_interval", 60.0),
    ],
)
def test_from_env(env, field, value):
    assert getattr(Settings.from_env(env), field) == value


def test_overrides_win_over_env():
    s = Settings.from_env({"JUPYTER_LLM_MAX_QUEUE": "7"}, max_queue=9, num_parallel=None)
    assert s.max_queue == 9 and s.num_parallel == 4  # the default


def test_models_dir_expands_user():
    assert "~" not in str(Settings.from_env({}).models_dir)


@pytest.mark.parametrize(
    "env",
    [
        {"JUPYTER_LLM_MAX_QUEUE": "lots"},
        {"JUPYTER_LLM_NEW_ESTIMATES": "maybe"},
        {"JUPYTER_LLM_KEEP_ALIVE": "soon"},
        {"JUPYTER_LLM_FLASH_ATTENTION": "sometimes"},
        {"JUPYTER_LLM_KV_CACHE_TYPE": "q5_1"},
        {"JUPYTER_LLM_KV_CACHE_TYPE": "int8"},
    ],
)
def test_bad_env_names_the_variable_and_the_value(env):
    name, value = next(iter(env.items()))
    with pytest.raises(ConfigError, match=f"{name}: '{value}'"):
        Settings.from_env(env)


def test_a_bad_cache_type_lists_the_types():
    with pytest.raises(ConfigError, match="expected f16, q8_0 or q4_0"):
        Settings.from_env({"JUPYTER_LLM_KV_CACHE_TYPE": "q8"})


def test_bad_override_names_the_value():
    with pytest.raises(ConfigError, match="load_timeout: 'banana'"):
        Settings.from_env({}, load_timeout="banana")


@pytest.mark.parametrize(("value", "expected"), [(-1, math.inf), ("10m", 600.0), (30, 30.0)])
def test_keep_alive_override_is_parsed_like_the_env(value, expected):
    assert Settings.from_env({}, keep_alive=value).keep_alive == expected


def test_flash_attention_override_is_parsed_like_the_env():
    assert Settings.from_env({}, flash_attention="TRUE").flash_attention == "on"


@pytest.mark.parametrize(
    ("value", "shown"), [("0.2", "0.2"), ("61", "61"), ("0", "0"), ("-1", "inf"), ("1h", "3600")]
)
def test_the_history_interval_is_bounded(value, shown):
    """Four samples a second at most, one a minute at least; never forever."""
    with pytest.raises(
        ConfigError,
        match=f"JUPYTER_LLM_HISTORY_INTERVAL: {shown}; expected a duration from 0.25 s to 60 s",
    ):
        Settings.from_env({"JUPYTER_LLM_HISTORY_INTERVAL": value})
