"""``POST /api/plan`` on simulated GPUs with real runners: the plan is what
the load that follows it reports in ``/api/ps``, a plan that must evict names
the model, a plan loads nothing, and bad bodies are 400s."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.memory import MIN_GPU_BYTES, EstimateOptions, estimate
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.request.options import MAX_CONTEXT

MiB, GiB = 1 << 20, 1 << 30
KINDS = ("device", "layers", "weights", "kv_cache", "graph")


async def plan(jp_fetch, model: str, **options) -> dict:
    body = {"model": model, "prompt": "ignored", "options": options}
    r = await jp_fetch("llm", "api", "plan", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def generate(jp_fetch, model: str, **options) -> None:
    body = {
        "model": model,
        "prompt": "hi",
        "stream": False,
        "options": {"num_predict": 2, "temperature": 0, **options},
    }
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    assert json.loads(r.body)["eval_count"] == 2


async def ps(jp_fetch) -> list[dict]:
    return json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]


def assert_plan_is_the_load(planned: dict, loaded: dict) -> None:
    """Layers per device, bytes by kind, context length: field by field."""
    assert planned["fits"] is True and planned["reason"] == ""
    assert [{k: e[k] for k in KINDS} for e in planned["layout"]] == [
        {k: a[k] for k in KINDS} for a in loaded["allocations"]
    ]
    for key in ("context_length", "num_gpu_layers", "num_layers", "size", "size_vram", "parallel"):
        assert planned[key] == loaded[key], key


def one_model_gpu(demo_gguf, **device) -> list[dict]:
    """A GPU that holds the whole demo model once, not twice."""
    est = estimate(read_model_info(demo_gguf), EstimateOptions(num_ctx=2048))
    one = MIN_GPU_BYTES + est.graph_full + sum(est.layer_size(i) for i in range(3))
    return [{"id": "GPU-0", "library": "CUDA", "name": "small", **device,
             "total_memory": 2 * one, "free_memory": one + MiB}]  # fmt: skip


class TestTwoGpus:
    @pytest.fixture
    def simulated_devices(self):
        return [
            {"id": "GPU-igpu", "library": "Vulkan", "name": "Radeon 780M", "integrated": True,
             "total_memory": 32 * GiB, "free_memory": 30 * GiB},
            {"id": "GPU-dgpu", "library": "Vulkan", "name": "RX 7600",
             "total_memory": 8 * GiB, "free_memory": 7 * GiB},
        ]  # fmt: skip

    async def test_the_plan_is_what_the_load_reports(self, jp_fetch, installed_model):
        planned = await plan(jp_fetch, "tiny")
        assert await ps(jp_fetch) == []  # a plan loads nothing
        assert planned["loaded"] is False and planned["evicts"] == []
        gpu, cpu = planned["layout"]
        assert (gpu["device"], gpu["name"], gpu["library"], gpu["layers"]) == (
            "GPU-dgpu", "RX 7600", "Vulkan", 3,
        )  # fmt: skip
        assert gpu["free_memory"] == 7 * GiB and gpu["total_memory"] == 8 * GiB
        assert (cpu["device"], cpu["layers"]) == ("cpu", 0)
        await generate(jp_fetch, "tiny")
        (loaded,) = await ps(jp_fetch)
        assert_plan_is_the_load(planned, loaded)
        # planned again, it is reused as it is
        again = await plan(jp_fetch, "tiny")
        assert again["loaded"] is True and again["evicts"] == []
        assert_plan_is_the_load(again, loaded)

    async def test_options_are_the_loads_options(self, jp_fetch, installed_model):
        planned = await plan(jp_fetch, "tiny", num_ctx=1024, num_gpu=2)
        assert planned["context_length"] == 1024 and planned["num_gpu_layers"] == 2
        await generate(jp_fetch, "tiny", num_ctx=1024, num_gpu=2)
        (loaded,) = await ps(jp_fetch)
        assert_plan_is_the_load(planned, loaded)
        # a larger context is a reload: the plan replaces the loaded runner
        bigger = await plan(jp_fetch, "tiny", num_ctx=2048)
        assert bigger["loaded"] is False and bigger["evicts"] == ["tiny:latest"]
        assert bigger["context_length"] == 2048  # capped at the model's trained 2048
        assert (await plan(jp_fetch, "tiny", num_ctx=1 << 20))["context_length"] == 2048


class TestEviction:
    @pytest.fixture
    def simulated_devices(self, demo_gguf):
        return one_model_gpu(demo_gguf)

    async def test_a_plan_that_evicts_names_the_model(self, jp_fetch, installed_model):
        await generate(jp_fetch, "tiny")
        planned = await plan(jp_fetch, "tiny2")
        assert planned["evicts"] == ["tiny:latest"] and planned["busy"] == []
        # on the GPU as it would be with tiny gone: all its layers there
        assert planned["layout"][0]["device"] == "GPU-0" and planned["num_gpu_layers"] == 3
        assert [m["name"] for m in await ps(jp_fetch)] == ["tiny:latest"]  # nothing evicted yet
        await generate(jp_fetch, "tiny2")
        (loaded,) = await ps(jp_fetch)
        assert loaded["name"] == "tiny2:latest"
        assert_plan_is_the_load(planned, loaded)


class TestDoesNotFit:
    @pytest.fixture
    def simulated_devices(self):
        return [{"id": "GPU-0", "library": "CUDA", "name": "tiny",
                 "total_memory": 500 * MiB, "free_memory": 400 * MiB}]  # fmt: skip

    async def test_says_why_with_the_loads_own_error(self, jp_fetch, installed_model):
        planned = await plan(jp_fetch, "tiny", num_gpu=2)
        reason = "memory layout cannot be allocated with num_gpu = 2"
        assert planned["fits"] is False and planned["reason"] == reason
        assert planned["layout"] == [] and planned["evicts"] == []
        with pytest.raises(HTTPClientError) as info:
            await generate(jp_fetch, "tiny", num_gpu=2)
        assert json.loads(info.value.response.body)["error"] == reason


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"model": "nothere"}, 404, "model 'nothere:latest' not found"),
        ({}, 400, "model"),
        ({"model": "tiny", "options": {"num_ctx": "big"}}, 400, "num_ctx"),
        ({"model": "tiny", "options": {"num_ctx": MAX_CONTEXT + 1}}, 400, "num_ctx"),
        ({"model": "tiny", "options": {"num_gpu": -2}}, 400, "num_gpu"),
        ({"model": "tiny", "options": []}, 400, "options"),
    ],
)  # fmt: skip
async def test_bad_bodies_are_client_errors(jp_fetch, installed_model, body, status, error):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "plan", method="POST", body=json.dumps(body))
    assert info.value.code == status
    assert error in json.loads(info.value.response.body)["error"]
