"""An administrator who unloads a model other users are streaming from cuts
their requests off; each of those streams ends saying so, not with the
runner's exit status ("runner process exited unexpectedly with status 0").

The scheduler closes the runner with a typed reason (``ModelUnloaded``); the
runner process fails what is in flight with it. Nothing matches error text."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from scheduler_env import ONE_GPU, entry, make
from test_fair_queue import ANN, ROOT
from waiting import until

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import ModelUnloaded
from jupyter_llm.scheduler import LoadOptions

LONG_CTX = 1 << 16  # a greedy generation of the demo model cannot end before it is cut off
ENDLESS = {"num_predict": -1, "num_ctx": LONG_CTX, "temperature": 0}
MESSAGE = "model 'long:latest' was unloaded by an administrator while this request ran"


async def test_the_scheduler_closes_a_busy_runner_with_the_reason():
    scheduler, factory = make(ONE_GPU, num_parallel=2)
    lease = await scheduler.acquire(entry("m"), LoadOptions(), None, ANN)
    assert await scheduler.unload("m:latest", ROOT)
    reason = factory.runners[0].close_reason
    assert isinstance(reason, ModelUnloaded) and reason.status == 503
    assert str(reason) == "model 'm:latest' was unloaded by an administrator while this request ran"
    lease.release()


async def test_an_idle_unload_gives_no_reason():
    scheduler, factory = make(ONE_GPU, num_parallel=2)
    (await scheduler.acquire(entry("m"), LoadOptions(), None, ANN)).release()
    assert await scheduler.unload("m:latest", ROOT)
    await until(lambda: not factory.runners[0].alive)
    assert factory.runners[0].close_reason is None  # nothing ran: nothing to explain


@pytest.fixture
def long_model(models_dir: Path, tmp_path: Path) -> str:
    store = ModelStore(models_dir)
    path = write_demo_model(tmp_path / "long.gguf", DemoModelSpec(context_length=LONG_CTX))
    store.create("long", {"long.gguf": store.add_blob_from_file(path)})
    return "long:latest"


@pytest.fixture
def client(jp_serverapp, jp_base_url, http_server, http_server_port) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/",
        headers={"Authorization": f"token {jp_serverapp.identity_provider.token}"},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("api/generate", {"model": "long", "prompt": "go on", "options": ENDLESS}),
        (
            "v1/chat/completions",
            {
                "model": "long",
                "stream": True,
                "max_tokens": 100000,
                "messages": [{"role": "user", "content": "go on"}],
            },
        ),
    ],
)
async def test_a_stream_cut_off_by_an_admins_unload_says_so(
    jp_serverapp, client, long_model, path, body
):
    scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
    async with client:
        async with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            assert (await anext(lines)).strip()  # the first token: the generation runs
            runner = scheduler.loaded_models()[0].runner
            assert await scheduler.unload(long_model, ROOT)  # an admin; "local" streams
            rest = [line async for line in lines if line.strip()]
    assert not runner.alive
    if path == "api/generate":
        error = json.loads(rest[-1])["error"]
    else:
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2].removeprefix("data: "))["error"]["message"]
    assert error == MESSAGE
