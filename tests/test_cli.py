"""``jupyter llm`` end to end: a live server, and embedded when none runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from live_server import LiveServer
from loopback import LoopbackServer, Remote

from jupyter_llm.models.store import ModelStore


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("cli-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    server = LiveServer(models, models)
    yield server
    server.stop()


def cli(*args: str, env: dict[str, str], stdin: str | None = None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "jupyter_llm.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        input=stdin,
        cwd=cwd,
    )


def test_list_ps_run_show(live):
    env = live.client_env
    out = cli("list", env=env)
    assert out.returncode == 0 and "tiny:latest" in out.stdout and "NAME" in out.stdout
    out = cli("run", "tiny", "say", "hi", "-n", "5", env=env)
    assert out.returncode == 0 and out.stdout.strip()
    out = cli("ps", env=env)
    assert "tiny:latest" in out.stdout and "100% CPU" in out.stdout
    out = cli("show", "tiny", env=env)
    assert "architecture        llama" in out.stdout and "completion" in out.stdout
    out = cli("run", "tiny", "-n", "3", env=env, stdin="piped prompt")
    assert out.returncode == 0 and out.stdout.strip()


def test_create_cp_rm(live, tmp_path, demo_gguf):
    env = live.client_env
    (tmp_path / "Modelfile").write_text(
        f"FROM {demo_gguf}\nPARAMETER num_predict 2\nSYSTEM Be brief.\n"
    )
    out = cli("create", "fromfile", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = cli("show", "fromfile", env=env)
    assert "num_predict" in out.stdout and "Be brief." in out.stdout
    assert cli("cp", "fromfile", "other:v1", env=env).returncode == 0
    assert "other:v1" in cli("list", env=env).stdout
    out = cli("rm", "fromfile", "other:v1", env=env)
    assert out.returncode == 0 and "deleted 'other:v1'" in out.stdout
    assert "fromfile" not in cli("list", env=env).stdout


def test_pull_with_progress(live, demo_gguf):
    remote = Remote()
    remote.add_model("library", "pulled", "latest", demo_gguf.read_bytes())
    server = LoopbackServer(remote)
    try:
        out = cli("pull", f"{server.host}/library/pulled", "--insecure", env=live.client_env)
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    assert "pulling manifest" in out.stdout and "success" in out.stdout
    assert "428k/428k" in out.stderr  # a byte progress bar was drawn to completion
    assert f"{server.host}/library/pulled:latest" in cli("list", env=live.client_env).stdout


def test_errors_are_one_line_with_the_server_message(live):
    out = cli("run", "nope", "hi", env=live.client_env)
    assert out.returncode == 1 and out.stderr.strip() == "Error: model 'nope:latest' not found"
    out = cli("rm", "../x", env=live.client_env)
    assert out.returncode == 1 and "invalid model name" in out.stderr
    out = cli("create", "x", "-f", "/nonexistent/Modelfile", env=live.client_env)
    assert out.returncode == 1 and "cannot read" in out.stderr


def test_embedded_when_no_server_runs(tmp_path, demo_gguf):
    store = ModelStore(tmp_path / "models")
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_LLM_")}
    env.update(
        JUPYTER_LLM_MODELS=str(tmp_path / "models"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime")
    )  # no running servers here
    before = runner_processes()
    out = cli("run", "tiny", "hello", "-n", "4", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "tiny:latest" in cli("list", env=env).stdout
    assert runner_processes() <= before  # the embedded engine stopped its runner


def runner_processes() -> set[int]:
    import psutil

    found = set()
    for p in psutil.process_iter(["cmdline"]):
        if "jupyter_llm.runner" in " ".join(p.info["cmdline"] or []):
            found.add(p.pid)
    return found


@pytest.mark.parametrize(
    ("size", "vram", "shown"),
    [
        (1000, 0, "100% CPU"),
        (1000, 1000, "100% GPU"),
        (1000, 520, "48%/52% CPU/GPU"),
        (1000, 996, "100% GPU"),
        (1000, 4, "100% CPU"),
        (0, 5, "100% CPU"),
    ],
)
def test_processor_column(size: int, vram: int, shown: str) -> None:
    """The same rule as the sidebar's processor() (labextension/src/format.ts)."""
    from jupyter_llm.kernel.ps import processor

    assert processor({"size": size, "size_vram": vram}) == shown
