"""The package as installed: the server extension is enabled by pip install."""

import re
import subprocess
import sys
from pathlib import Path


def test_server_extension_enabled_and_valid():
    jupyter = Path(sys.executable).with_name("jupyter")
    out = subprocess.run(
        [str(jupyter), "server", "extension", "list"], capture_output=True, text=True, timeout=120
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # drop colours
    assert "jupyter_llm enabled" in text
    assert re.search(r"jupyter_llm [0-9.]+ OK", text), text


def test_runner_module_runs_as_a_program():
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_llm.runner", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "--fd" in out.stdout
