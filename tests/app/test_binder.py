"""Binder: the repo2docker files are well formed, and a session like Binder's
(its start script, the demo model its postBuild installs, JupyterLab, the
quickstart notebook run in a kernel) fits in 1.5 GB of memory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from live_server import LiveServer

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
LIMIT = 1.5e9  # bytes


def test_environment_is_cpu_only_with_node_for_the_labextension() -> None:
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    deps = [d for d in env["dependencies"] if isinstance(d, str)]
    names = {re.split(r"[=<>]", d)[0] for d in deps}
    assert {"python", "pip", "nodejs", "cmake"} <= names
    python = next(d for d in deps if d.startswith("python="))
    assert tuple(map(int, python.split("=")[1].split("."))) >= (3, 11)
    assert not any(re.search(r"cuda|rocm|gpu", d, re.I) for d in deps)


def post_build_server_config() -> dict:
    """The Jupyter config that postBuild writes (its JSON here-document)."""
    post_build = (BINDER / "postBuild").read_text()
    config = re.search(r"<<'JSON'\n(.*?)\nJSON", post_build, re.S)
    assert config, "postBuild writes the server config"
    return json.loads(config.group(1))


def test_post_build_and_start_are_strict_executable_bash() -> None:
    for name in ("postBuild", "start"):
        script = BINDER / name
        assert os.access(script, os.X_OK), f"{name} must be executable"
        text = script.read_text()
        assert text.startswith("#!/bin/bash\n")
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    post_build = (BINDER / "postBuild").read_text()
    assert "set -euo pipefail" in post_build
    assert "pip install --no-cache-dir '.[lab]'" in post_build
    assert "python -m jupyter_llm.demo --install demo" in post_build
    assert "-DGGML_NATIVE=OFF" in post_build
    config = post_build_server_config()
    # `jupyter lab` serves its own default_url; a plain server uses ServerApp's
    for app in ("ServerApp", "LabApp"):
        default_url = config[app]["default_url"]
        assert (ROOT / default_url.removeprefix("/lab/tree/")).is_file()
    assert (BINDER / "start").read_text().rstrip().endswith('exec "$@"')


def session_memory(processes: list[psutil.Process]) -> int:
    """Proportional set size (shared pages split between sharers), summed."""
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except psutil.NoSuchProcess:
            pass
    return total


@pytest.mark.timeout(300)
def test_a_binder_session_fits_in_1_5_gb(tmp_path: Path) -> None:
    import nbformat
    from kernels import forget, kernel_manager
    from nbclient import NotebookClient

    models = tmp_path / "models"
    env = {**os.environ, "JUPYTER_LLM_MODELS": str(models)}
    subprocess.run(
        [sys.executable, "-m", "jupyter_llm.demo", "--install", "demo"],
        env=env,
        check=True,
        timeout=120,
    )
    config_dir = tmp_path / "jupyter"
    config_dir.mkdir()
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(post_build_server_config()))
    server = LiveServer(
        models,
        ROOT,
        wrapper=[str(BINDER / "start")],
        env={"JUPYTER_LLM_NUM_THREADS": "2", "JUPYTER_CONFIG_DIR": str(config_dir)},
        quick_start=False,  # the memory of a user's whole server
    )
    km = kernel_manager()
    try:
        landing = server.client.get(server.url, follow_redirects=False)
        assert landing.headers["location"].startswith("/lab/tree/examples/quickstart.ipynb")
        assert server.client.get(server.url + landing.headers["location"][1:]).status_code == 200
        nb = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
        km.start_kernel(
            env={**os.environ, "JUPYTER_LLM_URL": server.url, "JUPYTER_LLM_TOKEN": server.token},
            cwd=str(ROOT / "examples"),
        )
        NotebookClient(nb, km=km, timeout=180).execute()
        assert [m["name"] for m in server.client.get("api/ps").json()["models"]] == ["demo:latest"]

        server_tree = psutil.Process(server.proc.pid)
        kernel = psutil.Process(km.provisioner.pid)
        processes = [server_tree, *server_tree.children(recursive=True), kernel]
        used = session_memory(processes)
        print(f"Binder-like session: {used / 1e6:.0f} MB in {len(processes)} processes")
        assert used < LIMIT, f"{used / 1e9:.2f} GB"
    finally:
        km.shutdown_kernel(now=True)
        forget(km)
        server.stop()
