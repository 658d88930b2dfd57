"""``%llm usage`` in a real browser (Chromium, as test_labextension.py drives
JupyterLab): two cells run ``%%llm`` in a notebook, then ``%llm usage``
shows them as a table, each cell by its ``In [n]`` and the id JupyterLab gave
it. The server's own table agrees, under the kernel id of the notebook's
session. Screenshot: test-artifacts/usage-magic.png."""

# ruff: noqa: F811 (the fixtures imported from test_labextension are parameters here)
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from test_labextension import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    browser,
    chromium,
    jp_asyncio_loop,
    jp_server_cleanup,
    page,
    start_lab,
    stop_lab,
)

from jupyter_llm.models.store import ModelStore

OUTPUT = ".jp-Notebook .jp-OutputArea-output"


@pytest.fixture
def usage_home(tmp_path: Path, demo_gguf: Path) -> Path:
    store = ModelStore(tmp_path / "models")
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    (tmp_path / "Usage.ipynb").write_text(
        json.dumps({"cells": [], "metadata": kernel, "nbformat": 4, "nbformat_minor": 5})
    )
    return tmp_path


def run_in_last_cell(page, lines: list[str], count: int) -> None:
    """Type ``lines`` into the notebook's last cell, run it (Shift+Enter) and
    wait until it has run as ``In [count]``."""
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").last
    editor.click()
    for i, line in enumerate(lines):
        if i:
            page.keyboard.press("Enter")
        page.keyboard.type(line)
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        "n => [...document.querySelectorAll('.jp-InputArea-prompt')]"
        ".some(p => p.textContent.trim() === `[${n}]:`)",
        arg=count,
        timeout=120_000,
    )


@pytest.mark.timeout(600)  # JupyterLab's first page load and a kernel on 2 cores
def test_llm_usage_in_a_notebook(page, usage_home: Path) -> None:
    server = start_lab(usage_home, "usage")
    try:
        page.goto(f"{server.url}lab/tree/Usage.ipynb?token={server.token}")
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for()
        # the kernel is up before anything is typed (a cell run earlier may be lost)
        page.wait_for_function(
            "() => document.body.innerText.includes('(ipykernel) | Idle')", timeout=120_000
        )
        run_in_last_cell(page, ["%load_ext jupyter_llm"], 1)
        run_in_last_cell(page, ["%%llm tiny -n 4 -t 0", "Say hi"], 2)
        run_in_last_cell(page, ["%%llm tiny -n 6 -t 0", "Say more"], 3)
        run_in_last_cell(page, ["%llm usage"], 4)
        table = page.locator(f"{OUTPUT} table.jupyter-llm-usage").first
        table.wait_for(timeout=120_000)
        page.wait_for_function(
            "() => document.querySelectorAll('table.jupyter-llm-usage tbody tr').length >= 3"
        )
        shown = page.locator(OUTPUT).last.inner_text()
        assert "This kernel" in shown and "Server, every user (admin)" in shown
        assert "In [2]" in shown and "In [3]" in shown and "tiny:latest" in shown
        table.scroll_into_view_if_needed()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=ARTIFACTS / "usage-magic.png")

        auth = {"Authorization": f"token {server.token}"}
        sessions = httpx.get(f"{server.url}api/sessions", headers=auth).json()
        (kernel,) = [s["kernel"]["id"] for s in sessions if s["path"].endswith("Usage.ipynb")]
        body = server.client.get("api/usage", params={"kernel": kernel}).json()
        rows = sorted(body["cells"], key=lambda r: r["execution_count"])
        assert [(r["execution_count"], r["generated_tokens"]) for r in rows] == [(2, 4), (3, 6)]
        # JupyterLab's cell ids (UUIDs) came with the requests
        assert all(len(r["cell"]) == 36 for r in rows) and rows[0]["cell"] != rows[1]["cell"]
        assert rows[0]["cell"][:8] in shown
    except Exception:
        page.screenshot(path=ARTIFACTS / "usage-magic-failed.png")
        raise
    finally:
        stop_lab(server, page)
