"""The runner process never imports the server side, and the server's handle
on a runner shares only the wire protocol with it."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_SIDE = (
    "jupyter_llm.runner_client",
    "jupyter_llm.scheduler",
    "jupyter_llm.api",
    "jupyter_llm.app",
    "tornado",
    "jupyter_server",
)

IMPORT_PACKAGE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not info.name.endswith(".__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def modules_after_importing(package: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PACKAGE, package],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_the_runner_process_never_imports_the_server_side():
    loaded = modules_after_importing("jupyter_llm.runner")
    crossed = [m for m in loaded if any(m == s or m.startswith(s + ".") for s in SERVER_SIDE)]
    assert crossed == []


def test_the_runner_client_shares_only_the_protocol_with_the_runner():
    loaded = modules_after_importing("jupyter_llm.runner_client")
    runner_side = [m for m in loaded if m.startswith("jupyter_llm.runner.")]
    assert runner_side == ["jupyter_llm.runner.protocol"]
