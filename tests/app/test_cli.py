"""``jupyter llm`` end to end: a live server, found through the environment or
its runtime file; several servers (an error, not a second engine); embedded
when none runs, printing only its own output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from live_server import LiveServer
from loopback import LoopbackServer, Remote

from jupyter_llm.connect.views import models_table
from jupyter_llm.models.store import ModelStore


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("cli-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    runtime = tmp_path_factory.mktemp("cli-runtime")  # its jpserver-<pid>.json, ours alone
    server = LiveServer(models, models, {"JUPYTER_RUNTIME_DIR": str(runtime)})
    yield server
    server.stop()


def discovery_env(runtime: Path, **extra: str) -> dict[str, str]:
    """No JUPYTER_LLM_URL: the CLI finds servers through ``runtime`` alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_LLM_")}
    return {**env, "JUPYTER_RUNTIME_DIR": str(runtime), **extra}


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


def test_the_one_running_server_is_found(live):
    env = discovery_env(Path(live.env["JUPYTER_RUNTIME_DIR"]))
    out = cli("list", env=env)
    assert out.returncode == 0, out.stderr
    assert "tiny:latest" in out.stdout


def test_several_servers_are_an_error_not_a_second_engine(live, tmp_path):
    runtime = Path(live.env["JUPYTER_RUNTIME_DIR"])
    other = LiveServer(tmp_path, tmp_path, {"JUPYTER_RUNTIME_DIR": str(runtime)})
    try:
        out = cli("list", env=discovery_env(runtime))
    finally:
        other.stop()
    assert out.returncode == 1 and out.stdout == ""  # no embedded engine listed models
    assert out.stderr.startswith("Error: several Jupyter servers run jupyter-llm")
    for server in (live, other):
        assert f"{server.url}  pid {server.proc.pid}" in out.stderr
    assert "JUPYTER_LLM_URL" in out.stderr and "JUPYTER_LLM_TOKEN" in out.stderr


def test_embedded_when_no_server_runs(tmp_path, demo_gguf):
    """Only the command's output on stdout, and none of the engine's INFO log."""
    store = ModelStore(tmp_path / "models")
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    entry = store.get("tiny")
    os.utime(store.manifest_path(entry.name), (0, 0))  # "N days ago": stable while the test runs
    env = discovery_env(tmp_path / "runtime", JUPYTER_LLM_MODELS=str(tmp_path / "models"))

    def expected() -> str:
        row = {
            "name": entry.name.display,
            "digest": entry.digest,
            "size": entry.size,
            "modified_at": "1970-01-01T00:00:00Z",
        }
        return models_table([row]) + "\n"

    first = expected()
    out = cli("list", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout in (first, expected())  # the day may turn during the call
    assert_no_info(out.stderr)
    out = cli("ps", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "NAME   ID   SIZE   PROCESSOR   CONTEXT   UNTIL\n"
    assert_no_info(out.stderr)
    out = cli("run", "tiny", "hello", "-n", "4", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert_no_info(out.stderr)
    assert not runner_processes(tmp_path / "models")  # the embedded engine stopped its runner


def assert_no_info(stderr: str) -> None:
    """Jupyter's log lines start with ``[I``, ``[W``...; INFO and DEBUG ones must not appear."""
    chatter = [line for line in stderr.splitlines() if re.match(r"\[[ID] ", line)]
    assert not chatter, stderr
    # the CLI's own load progress ("loading tiny: 40%") is not the engine's log
    logged = "".join(re.split(r"(?m)^loading \S+: \d+%$", stderr))
    assert "jupyter-llm: models in" not in logged and "loading " not in logged, stderr


def runner_processes(models: Path) -> list[int]:
    """Runners serving ``models`` (they inherit JUPYTER_LLM_MODELS), whoever
    their parent is now: other tests' runners on this machine do not count."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        if "jupyter_llm.runner" not in " ".join(p.info["cmdline"] or []):
            continue
        try:
            if p.environ().get("JUPYTER_LLM_MODELS") == str(models):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_doctor_on_this_machine(live):
    """Real discovery through the runner interpreter; this machine shows no GPU."""
    out = cli("doctor", env=live.client_env)
    assert "runner interpreter:" in out.stdout and "CPU" in out.stdout, out.stderr
    assert ("OK: nothing to fix." in out.stdout) == (out.returncode == 0)


@pytest.fixture(scope="module")
def idle_gpu_live(tmp_path_factory):
    models = tmp_path_factory.mktemp("doctor-models")
    env = {
        "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("doctor-runtime")),
        "JUPYTER_LLM_SIMULATED_HOST_GPUS": '[{"vendor": "nvidia", "name": "H200"}]',
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(
            [{"id": "cpu", "library": "CPU", "name": "CPU", "total_memory": 8, "free_memory": 8}]
        ),
    }
    server = LiveServer(models, models, env)
    yield server
    server.stop()


def test_doctor_explains_an_idle_gpu(idle_gpu_live):
    out = cli("doctor", env=idle_gpu_live.client_env)
    assert out.returncode == 1
    assert "H200" in out.stdout and "fix: make lab GPU=cuda" in out.stdout
    out = cli("doctor", "--json", env=idle_gpu_live.client_env)
    assert out.returncode == 1 and json.loads(out.stdout)["notices"][0]["kind"] == "idle_gpu"


def test_plan_prints_the_layout_and_loads_nothing(live):
    env = live.client_env
    assert cli("cp", "tiny", "planned", env=env).returncode == 0  # a name no other test loads
    out = cli("plan", "planned", "--num-ctx", "512", env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "planned:latest fits: 0/3 layers on GPUs"
    assert lines[1] == "context 512, 4 parallel"
    header = ["DEVICE", "NAME", "LIBRARY", "LAYERS", "WEIGHTS", "KV", "CACHE", "GRAPH", "FREE"]
    assert lines[-2].split() == header
    assert lines[-1].split()[:4] == ["cpu", "CPU", "CPU", "3"]
    plan = json.loads(cli("plan", "planned", "--num-gpu", "0", "--json", env=env).stdout)
    assert plan["fits"] is True and plan["context_length"] == 2048  # the model's trained context
    assert [e["device"] for e in plan["layout"]] == ["cpu"]
    assert "planned:latest" not in cli("ps", env=env).stdout  # nothing was loaded
    out = cli("plan", "nothere", env=env)
    assert out.returncode == 1 and "model 'nothere:latest' not found" in out.stderr
    cli("rm", "planned", env=env)
