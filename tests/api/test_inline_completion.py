"""What the labextension's inline completer relies on in the server: a model
with fill-in-the-middle tokens says "insert" in /api/show, and a completion
stream the browser aborts (a new keystroke) cancels its generation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from endless import FOREVER
from waiting import until

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

# the body labextension/src/completion.ts builds, with a budget it cannot finish
COMPLETION = {
    "model": "tiny",
    "prompt": "def add(a, b):\n    return",
    "suffix": "\n\nprint(add(1, 2))\n",
    "raw": True,
    "stream": True,
    "options": {"num_predict": FOREVER, "temperature": 0.2, "top_p": 0.9, "stop": ["\n\n"]},
}


async def test_a_demo_model_can_insert(jp_fetch, installed_model):
    r = await jp_fetch("llm", "api", "show", method="POST", body=json.dumps({"model": "tiny"}))
    assert "insert" in json.loads(r.body)["capabilities"]


async def test_a_model_without_fim_tokens_cannot_insert(jp_fetch, models_dir, tmp_path: Path):
    """What the sidebar's "cannot insert" line reads."""
    gguf = write_demo_model(tmp_path / "nofim.gguf", DemoModelSpec(fim=False))
    store = ModelStore(models_dir)
    store.create("nofim", {"nofim.gguf": store.add_blob_from_file(gguf)})
    r = await jp_fetch("llm", "api", "show", method="POST", body=json.dumps({"model": "nofim"}))
    capabilities = json.loads(r.body)["capabilities"]
    assert "completion" in capabilities
    assert "insert" not in capabilities


async def test_a_fill_in_the_middle_completion_streams(jp_fetch, installed_model):
    body = {**COMPLETION, "options": {**COMPLETION["options"], "num_predict": 4, "stop": []}}
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    pieces = [json.loads(line) for line in r.body.decode().splitlines() if line.strip()]
    assert pieces[-1]["done"] is True
    assert pieces[-1]["eval_count"] == 4
    assert len(pieces) >= 2  # streamed: pieces before the last


async def test_an_aborted_completion_cancels_its_generation(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, endless_model
):
    await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps({"model": "endless"}))
    scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
    loaded = scheduler.loaded_models()[0]
    token = jp_serverapp.identity_provider.token
    body = json.dumps({**COMPLETION, "model": "endless"}).encode()
    port = http_server_port[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {jp_base_url}llm/api/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: token {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b'"done": false'), 60)  # streaming has started

    async def busy() -> bool:
        return (await loaded.runner.process.call("health"))["busy"] is not None

    assert await busy()
    writer.close()  # what AbortController does to the browser's fetch
    await until(lambda: loaded.refcount == 0, 30, "the request's release")

    async def idle() -> bool:
        return not await busy()

    await until(idle, 30, "the runner to stop generating")  # within a token or so
