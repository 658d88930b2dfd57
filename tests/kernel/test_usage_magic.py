"""``%llm usage`` through a real kernel and a live server: the kernel's
requests carry its kernel id (the one Jupyter gave it), each cell's id (from
the execute request's metadata, as JupyterLab sends it) and its execution
count; ``%llm usage`` then shows this kernel's cells and the user's totals.
The view's tables are pure functions, tested with hostile strings too."""

from __future__ import annotations

import json
import uuid

import pytest
from live_server import LiveServer

from jupyter_llm.connect import ServerEndpoint
from jupyter_llm.kernel.usage_view import cell_label, usage_html, usage_text
from jupyter_llm.models.store import ModelStore
from tests.support.waiting import iopub_until

CELL_IDS = ("9d1f2c3b-aaaa-4bbb-8ccc-000000000001", "9d1f2c3b-aaaa-4bbb-8ccc-000000000002")


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("usage-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    env = {"JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("usage-runtime"))}
    server = LiveServer(models, models, env)
    yield server
    server.stop()


def run_cell(kc, code: str, cell_id: str | None = None) -> dict:
    """Execute ``code`` as JupyterLab does (``cellId`` in the metadata); the
    cell's execute_result, or None when it has none."""
    metadata = {"cellId": cell_id} if cell_id else {}
    content = {"code": code, "silent": False, "store_history": True,
               "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}  # fmt: skip
    msg = kc.session.msg("execute_request", content, metadata=metadata)
    kc.shell_channel.send(msg)
    found: dict = {}

    def seen(m: dict) -> bool:
        if m["msg_type"] == "execute_result":
            found.update(m["content"]["data"])
        return m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"

    iopub_until(kc, msg["header"]["msg_id"], seen, 120, f"the cell {code[:20]!r} to end")
    return found


def test_usage_through_a_real_kernel(live, tmp_path):
    from kernels import running_kernel

    # named as jupyter_server names a kernel's connection file: kernel-<its id>.json
    kid = str(uuid.uuid4())
    with running_kernel(live.client_env, tmp_path / f"kernel-{kid}.json") as (_, kc):
        run_cell(kc, "%load_ext jupyter_llm")
        run_cell(kc, "%%llm tiny -n 4 -t 0\nhello", CELL_IDS[0])  # In [2]
        run_cell(kc, "%%llm tiny -n 4 -t 0\nhello", CELL_IDS[0])  # the same cell again
        run_cell(kc, "%%llm tiny -n 6 -t 0\nhello again", CELL_IDS[1])  # In [4]
        shown = run_cell(kc, "%llm usage")

    endpoint = ServerEndpoint(live.url, live.token, "env")
    body = endpoint.request("GET", "api/usage", params={"kernel": kid})
    cells = {r["cell"]: r for r in body["cells"]}
    assert set(cells) == set(CELL_IDS)  # the kernel id is the server's own for it
    first, second = cells[CELL_IDS[0]], cells[CELL_IDS[1]]
    assert (first["requests"], first["execution_count"], first["generated_tokens"]) == (2, 3, 8)
    assert (second["requests"], second["execution_count"], second["generated_tokens"]) == (1, 4, 6)
    assert [(r["user"], r["requests"]) for r in body["users"]] == [("local", 3)]

    text = shown["text/plain"].replace("'", "")
    assert f"This kernel ({kid})" in text
    assert "In [3] 9d1f2c3b   tiny:latest   2" in text
    assert "In [4] 9d1f2c3b   tiny:latest   1" in text
    assert "Server, every user (admin)" in text and "local   tiny:latest   3" in text
    assert "<table class='jupyter-llm-usage'>" in shown["text/html"]


def test_the_view_escapes_what_clients_sent():
    row = {"user": "<b>eve</b>", "kernel": "k", "cell": "<img src=x>", "execution_count": None,
           "model": "m<script>", "requests": 1, "prompt_tokens": 2, "generated_tokens": 3,
           "tokens_per_second": None, "time_to_first_token": None, "decode_seconds": 0.0,
           "device_seconds": 1.5}  # fmt: skip
    body = {"user": "<b>eve</b>", "admin": False, "users": [row], "cells": [row]}
    page = usage_html(body, "k<")
    assert "<script>" not in page and "<img" not in page and "<b>eve" not in page
    assert "&lt;img src=x&gt;" in page and "k&lt;" in page
    text = usage_text(body, "k")
    assert "Server, user <b>eve</b>" in text and "2+3" in text and "1.50" in text


@pytest.mark.parametrize(
    ("row", "label"),
    [
        ({"cell": "abcdef0123456789", "execution_count": 7}, "In [7] abcdef01"),
        ({"cell": "In [7]", "execution_count": 7}, "In [7]"),
        ({"cell": "", "execution_count": None}, "-"),
        ({"cell": "c1", "execution_count": None}, "c1"),
    ],
)
def test_cell_label(row, label):
    assert cell_label(row) == label


def test_usage_with_no_requests_yet():
    body = {"user": "u", "admin": False, "users": [], "cells": []}
    assert usage_text(body, "k").count("no requests yet") == 2
    assert json.dumps(usage_html(body, "k")).count("no requests yet") == 2
