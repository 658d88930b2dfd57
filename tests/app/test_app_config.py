"""The README's configuration examples work as written; a bad value stops the
server with a message naming it (rather than a warning and a server running
on without jupyter-llm)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from live_server import LiveServer
from traitlets import TraitError
from traitlets.config.loader import KVArgParseConfigLoader, PyFileConfigLoader

from jupyter_llm.app import LLMExtension
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import ConfigError


@pytest.fixture(autouse=True)
def no_llm_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("JUPYTER_LLM_"):
            monkeypatch.delenv(name)


def app_from_argv(argv: list[str]) -> LLMExtension:
    """The extension configured as the server configures it: the server's
    command line parsed without knowing our traits, handed over as config."""
    return LLMExtension(config=KVArgParseConfigLoader(argv).load_config())


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--LLMExtension.keep_alive=10m"], "keep_alive", 600.0),
        (["--LLMExtension.keep_alive=1h30m"], "keep_alive", 5400.0),
        (["--LLMExtension.keep_alive=45"], "keep_alive", 45.0),
        (["--LLMExtension.keep_alive=-1"], "keep_alive", math.inf),
        (["--LLMExtension.load_timeout=5m"], "load_timeout", 300.0),
        (["--LLMExtension.models_dir=~/m"], "models_dir", Path("~/m").expanduser()),
        (["--LLMExtension.context_length=8192"], "context_length", 8192),
        (["--LLMExtension.max_loaded_models=2"], "max_loaded_models", 2),
        (["--LLMExtension.num_parallel=2"], "num_parallel", 2),
        (["--LLMExtension.max_queue=7"], "max_queue", 7),
        (["--LLMExtension.num_threads=4"], "num_threads", 4),
        (["--LLMExtension.stream_interval=0.05"], "stream_interval", 0.05),
        (["--LLMExtension.history_interval=500ms"], "history_interval", 0.5),
        (["--LLMExtension.gpu_overhead=1073741824"], "gpu_overhead", 1 << 30),
        (["--LLMExtension.new_estimates=True"], "new_estimates", True),
        (
            ["--LLMExtension.python=/opt/venv-cuda/bin/python"],
            "python",
            "/opt/venv-cuda/bin/python",
        ),
    ],
)
def test_command_line_traits(argv, field, value):
    assert getattr(app_from_argv(argv).build_settings(), field) == value


@pytest.mark.parametrize(
    ("line", "value"),
    [('c.LLMExtension.keep_alive = "10m"', 600.0), ("c.LLMExtension.keep_alive = 600", 600.0)],
)
def test_config_file_traits(tmp_path, line, value):
    (tmp_path / "jupyter_server_config.py").write_text(line + "\n")
    config = PyFileConfigLoader("jupyter_server_config.py", str(tmp_path)).load_config()
    assert LLMExtension(config=config).build_settings().keep_alive == value


def test_the_trait_wins_over_the_env(monkeypatch):
    monkeypatch.setenv("JUPYTER_LLM_KEEP_ALIVE", "1h")
    assert app_from_argv([]).build_settings().keep_alive == 3600.0
    assert app_from_argv(["--LLMExtension.keep_alive=2m"]).build_settings().keep_alive == 120.0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--LLMExtension.keep_alive=banana"], "LLMExtension.keep_alive: 'banana'"),
        (["--LLMExtension.load_timeout=5 minutes"], "LLMExtension.load_timeout: '5 minutes'"),
        (["--LLMExtension.max_queue=lots"], "'lots'"),
    ],
)
def test_bad_trait_is_refused_naming_it(argv, named):
    with pytest.raises(TraitError, match=named):
        app_from_argv(argv)


def test_a_history_interval_out_of_bounds_is_refused():
    named = r"HISTORY_INTERVAL: 0\.1; expected a duration from 0\.25 s to 60 s"
    with pytest.raises(ConfigError, match=named):
        app_from_argv(["--LLMExtension.history_interval=100ms"]).build_settings()


def test_bad_env_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("JUPYTER_LLM_MAX_QUEUE", "lots")
    with pytest.raises(ConfigError, match="JUPYTER_LLM_MAX_QUEUE: 'lots'"):
        app_from_argv([]).build_settings()


# -- a real `jupyter server` process ------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store_with_tiny(tmp_path, demo_gguf) -> Path:
    models = tmp_path / "models"
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    return models


def test_server_takes_a_duration_on_the_command_line(tmp_path, store_with_tiny):
    server = LiveServer(
        store_with_tiny,
        tmp_path,
        args=["--LLMExtension.keep_alive=10m", "--LLMExtension.load_timeout=5m"],
    )
    try:
        before = time.time()
        r = server.client.post("api/generate", json={"model": "tiny"})  # load only
        assert r.status_code == 200, r.text
        (model,) = server.client.get("api/ps").json()["models"]
        after = time.time()
    finally:
        server.stop()
    expires = datetime.fromisoformat(model["expires_at"].replace("Z", "+00:00")).timestamp()
    assert before + 600 - 1 <= expires <= after + 600 + 1


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--LLMExtension.keep_alive=banana"], {}, ("keep_alive", "banana")),
        (["--LLMExtension.max_queue=lots"], {}, ("max_queue", "lots")),
        ([], {"JUPYTER_LLM_KEEP_ALIVE": "soon"}, ("JUPYTER_LLM_KEEP_ALIVE", "soon")),
    ],
)
def test_bad_value_stops_the_server(tmp_path, args, env, named):
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            f"--port={free_port()}",
            "--ip=127.0.0.1",
            f"--ServerApp.root_dir={tmp_path}",
            f"--LLMExtension.models_dir={tmp_path / 'models'}",
            *args,
        ],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=120)  # it exits by itself, or fails here
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode not in (0, None), output
    assert "bad configuration" in output, output
    assert all(word in output for word in named), output
    assert "is running at" not in output, output
