"""The sidebar's history in a real browser (Chromium, as test_labextension.py
drives it): while a model streams, the GPU's chart shows memory by model,
its utilization line and a nonzero tokens/s; after a reload the history is
still there, from the server. Screenshots: test-artifacts/sidebar-history*.png."""

# ruff: noqa: F811 (the fixtures imported from test_labextension are parameters here)
from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from test_labextension import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    SIMULATED_GPU,
    browser,
    chromium,
    jp_asyncio_loop,
    jp_server_cleanup,
    lab_home,
    open_sidebar,
    page,
    start_lab,
    stop_lab,
)
from waiting import until_sync

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

HISTORY = ".jp-LLM-history"
GPU_CHART = '.jp-LLM-history-memory[data-device="GPU-0"]'
TOKENS_CHART = ".jp-LLM-history-tokens"


class Stream:
    """A long generation read in a thread until ``stop``: a model that is
    still streaming while the screenshots are taken."""

    def __init__(self, server, model: str) -> None:
        self.tokens = 0
        self.finished = False  # it ended by itself (not stopped)
        self._stop = threading.Event()
        self._client = httpx.Client(
            base_url=server.client.base_url, headers=server.client.headers, timeout=120
        )
        body = {"model": model, "prompt": "Tell a long story.", "keep_alive": "10m",
                "options": {"num_predict": 8000, "num_ctx": 8192, "temperature": 1}}  # fmt: skip
        self._thread = threading.Thread(target=self._read, args=(body,), daemon=True)
        self._thread.start()

    def _read(self, body: dict) -> None:
        with self._client.stream("POST", "api/generate", json=body) as response:
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if '"done":true' in line.replace(" ", ""):
                    self.finished = True
                    return
                self.tokens += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._client.close()


def history_text(page, selector: str) -> str:
    return page.locator(f"{HISTORY} {selector}").inner_text()


@pytest.mark.timeout(600)  # JupyterLab's first page load and a CPU model on 2 cores
def test_history_while_a_model_streams_and_after_a_reload(page, lab_home: Path) -> None:
    small = write_demo_model(lab_home / "small.gguf", DemoModelSpec())
    store = ModelStore(lab_home / "models")
    store.create("small", {"small.gguf": store.add_blob_from_file(small)})
    small.unlink()
    # a sample every 0.5 s (2 s by default): the waits for streaming samples and for
    # an idle one are a quarter as long; the ring (300 samples) still holds 150 s
    server = start_lab(
        lab_home,
        "history",
        extra=["--LLMExtension.history_interval=0.5"],
        gpus=[{**SIMULATED_GPU, "utilization": 42}],
    )
    stream = None
    try:
        sidebar = open_sidebar(page, server)
        section = sidebar.locator(HISTORY)
        section.wait_for(state="visible")
        shape = server.client.get("api/history").json()
        assert (shape["interval"], shape["window"]) == (0.5, 150)  # the setting reached it
        loaded = server.client.post("api/generate", json={"model": "small", "keep_alive": "10m"})
        assert loaded.status_code == 200, loaded.text
        stream = Stream(server, "demo")
        until_sync(lambda: stream.tokens > 0 or stream.finished, 180, "the first streamed token")

        # a few samples of the stream, so the screenshots show it over time
        def streaming_samples() -> bool:
            samples = server.client.get("api/history").json()["samples"]
            return sum(1 for p in samples if p["tokens_per_second"].get("demo:latest")) >= 4

        until_sync(streaming_samples, 120, "four samples with demo's tokens/s")

        # the GPU's chart: both models' memory, stacked, and the utilization line
        gpu = section.locator(GPU_CHART)
        for model in ("demo:latest", "small:latest"):
            gpu.locator(f'path.jp-LLM-history-area[data-model="{model}"]').wait_for()
        assert gpu.locator(".jp-LLM-history-utilization").count() == 1
        assert gpu.locator(".jp-LLM-history-now").inner_text() == "GPU 42%"
        area = gpu.locator('path[data-model="demo:latest"]')
        height = float(area.evaluate("n => n.getBoundingClientRect().height"))
        assert height > 2, "demo's memory is visible in the chart"

        # tokens/s: nonzero while it streams
        page.wait_for_function(
            "() => { const n = document.querySelector('.jp-LLM-history-tokens "
            ".jp-LLM-history-now'); return n && parseFloat(n.textContent) > 0 }",
            timeout=120_000,
        )
        rate = float(history_text(page, f"{TOKENS_CHART} .jp-LLM-history-now").split()[0])
        assert rate > 0
        assert section.locator(f'{TOKENS_CHART} path[data-model="demo:latest"]').count() == 1
        section.scroll_into_view_if_needed()
        page.screenshot(path=ARTIFACTS / "sidebar-history-streaming.png")
        section.screenshot(path=ARTIFACTS / "sidebar-history-panel.png")
        assert not stream.finished, "the model was still streaming at the screenshots"
        stream.stop()

        # once the server's newest sample has no tokens, a reload still shows the stream
        def idle() -> bool:
            samples = server.client.get("api/history").json()["samples"]
            return bool(samples) and not samples[-1]["tokens_per_second"]

        until_sync(idle, 60, "a sample after the stream")
        sidebar = open_sidebar(page, server)  # the saved layout may reopen it
        section = sidebar.locator(HISTORY)
        section.locator(f'{TOKENS_CHART} path[data-model="demo:latest"]').wait_for()
        section.locator(f'{GPU_CHART} path[data-model="small:latest"]').wait_for()
        peak = history_text(page, f"{TOKENS_CHART} .jp-LLM-history-scale")
        assert float(peak.split()[1]) > 0, peak
        section.scroll_into_view_if_needed()
        page.screenshot(path=ARTIFACTS / "sidebar-history-after-reload.png")
        section.screenshot(path=ARTIFACTS / "sidebar-history-after-reload-panel.png")
    finally:
        if stream is not None:
            stream.stop()
        stop_lab(server, page)
