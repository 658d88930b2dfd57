"""``jupyter_llm.connect``, the client side shared by the CLI and the kernel:
its pure labels and views, and the rule that the two never import each other."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import jupyter_llm
from jupyter_llm.connect import discovery
from jupyter_llm.connect.labels import ago, human_size, processor_label, threads_label, until
from jupyter_llm.connect.views import loaded_table, table


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
def test_processor_label(size: int, vram: int, shown: str) -> None:
    """The same rule as the sidebar's processor() (labextension/src/format.ts)."""
    assert processor_label({"size": size, "size_vram": vram}) == shown


@pytest.mark.parametrize(
    ("vram", "layers", "on_gpu", "shown"),
    [
        (960, 9, 9, "100% GPU"),  # every layer: the host's buffers do not count
        (520, 9, 4, "48%/52% CPU/GPU"),
        (0, 9, 0, "100% CPU"),
        (960, 0, 0, "4%/96% CPU/GPU"),  # no layer counts: the memory split
    ],
)
def test_processor_label_with_layers(vram: int, layers: int, on_gpu: int, shown: str) -> None:
    model = {"size": 1000, "size_vram": vram, "num_layers": layers, "num_gpu_layers": on_gpu}
    assert processor_label(model) == shown


@pytest.mark.parametrize(
    ("threads", "vram", "shown"),
    [
        ({"now": 2, "loaded": 2, "adaptive": True}, 0, "2 threads"),
        ({"now": 1, "loaded": 2, "adaptive": True}, 0, "1 of 2 threads"),  # a core was held
        ({"now": 1, "loaded": 1, "adaptive": False}, 0, "1 thread"),
        ({"now": 0, "loaded": 4, "adaptive": False}, 0, "4 threads"),  # no request yet said
        ({"now": 9, "loaded": 4, "adaptive": True}, 0, "4 threads"),  # past loaded: not believed
        ({"now": 2, "loaded": 0, "adaptive": False}, 0, ""),  # the runner did not say
        ({"now": 1, "loaded": 2, "adaptive": True}, 1000, ""),  # wholly on GPUs
        ({"now": 1, "loaded": 2, "adaptive": True}, 520, "1 of 2 threads"),
        (None, 0, ""),  # an older server
        ({"now": True, "loaded": "2"}, 0, ""),
    ],
)
def test_threads_label(threads, vram: int, shown: str) -> None:
    model = {"size": 1000, "size_vram": vram, **({"threads": threads} if threads else {})}
    assert threads_label(model) == shown


@pytest.mark.parametrize(
    ("n", "shown"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (438_016, "438.0 KB"), (4.7e9, "4.7 GB")],
)
def test_human_size(n: float, shown: str) -> None:
    assert human_size(n) == shown


@pytest.mark.parametrize(
    ("iso", "shown"),
    [
        ("2026-01-01T11:59:30Z", "just now"),
        ("2026-01-01T11:59:00Z", "1 minute ago"),
        ("2026-01-01T09:00:00Z", "3 hours ago"),
        ("2025-12-30T12:00:00Z", "2 days ago"),
        ("not a time", "not a time"),
    ],
)
def test_ago(iso: str, shown: str) -> None:
    assert ago(iso, now=datetime(2026, 1, 1, 12, tzinfo=UTC)) == shown


def test_tables() -> None:
    assert table([["a", "bb"]], ["X", "Y"]) == "X   Y\na   bb"
    ps = {"name": "m:latest", "digest": "0123456789abcdef", "size": 2000, "size_vram": 2000}
    assert loaded_table([{**ps, "context_length": 4096, "expires_at": "soon"}]).splitlines() == [
        "NAME       ID             SIZE     PROCESSOR   CONTEXT   UNTIL",
        "m:latest   0123456789ab   2.0 KB   100% GPU    4096      soon",
    ]
    # a plain server's one user is not shown; a shared engine's users are
    local = [{"name": "local", "running": 1, "queued": 0}]
    assert "USERS" not in loaded_table([{**ps, "users": local}])
    shared = [{"name": "alice", "running": 1, "queued": 0}, {"name": "bob", "running": 0}]
    lines = loaded_table([{**ps, "users": shared}, {**ps, "name": "n:latest"}]).splitlines()
    assert lines[0].split()[-1] == "USERS"
    assert lines[1].endswith("alice, bob") and "alice" not in lines[2]


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(a.name for a in node.names)
    return modules


def test_cli_and_kernel_import_connect_not_each_other() -> None:
    package = Path(jupyter_llm.__file__).parent
    cli = imported_modules(package / "cli.py")
    kernel = set().union(*(imported_modules(p) for p in (package / "kernel").glob("*.py")))
    assert not {m for m in cli if m.startswith("jupyter_llm.kernel")}
    assert not {m for m in kernel if m == "jupyter_llm.cli"}
    assert "jupyter_llm.connect" in cli and "jupyter_llm.connect" in kernel
    connect = set().union(*(imported_modules(p) for p in (package / "connect").glob("*.py")))
    assert not {m for m in connect if m.startswith(("jupyter_llm.kernel", "jupyter_llm.cli"))}


NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expires_at", "shown"),
    [
        ("2026-12-03T12:04:30Z", "4 minutes from now"),
        ("2026-12-03T12:00:20Z", "less than a minute from now"),
        ("2026-12-03T14:00:00+00:00", "2 hours from now"),
        ("2026-12-03T11:59:00Z", "Stopping..."),
        ("2318-03-15T00:00:00Z", "Forever"),
        ("soon", "soon"),
    ],
)
def test_until(expires_at: str, shown: str) -> None:
    assert until(expires_at, NOW) == shown


def test_running_servers_reads_live_servers_files_only(tmp_path: Path) -> None:
    """As ``jupyter server list`` reads them, without importing the server."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()  # reaped: its pid names no process now
    me = {"url": "http://127.0.0.1:8888/", "token": "t", "pid": os.getpid()}
    files = {
        "jpserver-1.json": me,
        "jpserver-2.json": {**me, "pid": exited.pid},  # a server that died
        "jpserver-3.json": {**me, "pid": "1"},  # not a pid
        "jpserver-4.json": {k: v for k, v in me.items() if k != "url"},
        "jpserver-5.json": [me],
        "jpserver-6.json": {**me, "pid": 1 << 80},
        "jpserver-7-open.html": me,  # not a server file
        "jpserver-8.json": {**me, "pad": "x" * discovery.MAX_SERVER_FILE},  # too large
        "nbserver-9.json": me,
    }
    for name, info in files.items():
        (tmp_path / name).write_text(json.dumps(info))
    (tmp_path / "jpserver-10.json").write_text("{not json")
    (tmp_path / "jpserver-11.json").write_text("[" * 100_000 + "]" * 100_000)
    assert discovery.running_servers(tmp_path) == [me]
    assert discovery.running_servers(tmp_path / "missing") == []


def test_running_servers_reads_a_bounded_number_of_files(tmp_path: Path) -> None:
    me = {"url": "http://127.0.0.1:8888/", "pid": os.getpid()}
    for i in range(discovery.MAX_SERVER_FILES + 5):
        (tmp_path / f"jpserver-{i:04d}.json").write_text(json.dumps({**me, "n": i}))
    found = discovery.running_servers(tmp_path)
    assert [s["n"] for s in found] == list(range(discovery.MAX_SERVER_FILES))
