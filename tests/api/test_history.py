"""``GET /api/history`` on simulated GPUs with a real runner: the sampler runs
with the extension, a generation shows up as the model's memory on the GPU
and a nonzero tokens/s, the simulated utilization is reported, ``points``
downsamples, and a bad ``points`` or no token is refused."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError
from waiting import until

GiB = 1 << 30


@pytest.fixture
def simulated_devices():
    return [{"id": "GPU-0", "library": "CUDA", "name": "Sim 8G", "utilization": 37,
             "total_memory": 8 * GiB, "free_memory": 7 * GiB}]  # fmt: skip


async def start(serverapp) -> None:
    """What a real server does once its loop runs (pytest-jupyter stops short of it)."""
    await serverapp.extension_manager.start_all_extensions()


async def history(jp_fetch, **params) -> dict:
    r = await jp_fetch("llm", "api", "history", params=params)
    return json.loads(r.body)


async def test_not_started_it_is_empty(jp_fetch):
    got = await history(jp_fetch)
    assert got["sampling"] is False and got["samples"] == []


async def test_a_generation_is_in_the_history(jp_fetch, jp_serverapp, installed_model):
    await start(jp_serverapp)
    first = await history(jp_fetch)
    assert first["sampling"] is True and first["window"] == 600 and first["interval"] == 2.0
    body = {"model": "tiny", "prompt": "hi", "stream": False,
            "options": {"num_predict": 24, "temperature": 0}}  # fmt: skip
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    assert json.loads(r.body)["eval_count"] == 24

    async def with_tokens():
        samples = (await history(jp_fetch))["samples"]
        return next((p for p in samples if p["tokens_per_second"].get("tiny:latest")), None)

    point = await until(with_tokens, timeout=60, what="a sample with tiny's tokens/s", poll=0.2)
    assert point["tokens_per_second"]["tiny:latest"] > 0
    assert point["memory"]["GPU-0"]["tiny:latest"] > 0
    assert point["utilization"] == {"GPU-0": 37.0}
    got = await history(jp_fetch)
    assert [d["id"] for d in got["devices"]] == ["GPU-0", "cpu"]
    assert got["devices"][0]["total_memory"] == 8 * GiB
    ts = [p["t"] for p in got["samples"]]
    assert ts == sorted(ts) and len(ts) >= 2
    assert len((await history(jp_fetch, points="1"))["samples"]) == 1


@pytest.mark.parametrize("points", ["0", "301", "-1", "x", "1.5", "9" * 12])
async def test_bad_points_are_a_400(jp_fetch, points):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("llm", "api", "history", params={"points": points})
    assert e.value.code == 400
    message = json.loads(e.value.response.body)["error"]
    assert "points" in message, message
    if points == "301":
        assert "history_points" in message


async def test_a_token_is_needed(jp_fetch):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("llm", "api", "history", headers={"Authorization": ""})
    assert e.value.code == 403
