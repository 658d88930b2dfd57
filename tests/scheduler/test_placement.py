"""The seed behaviours end to end: real runners, simulated devices, the HTTP API."""

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.memory import MIN_GPU_BYTES, EstimateOptions, estimate
from jupyter_llm.memory.model_info import read_model_info

MiB, GiB = 1 << 20, 1 << 30


async def generate(jp_fetch, model, **body):
    body = {
        "model": model,
        "prompt": "hi",
        "stream": False,
        "options": {"num_predict": 2, "temperature": 0, **body.pop("options", {})},
        **body,
    }
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def ps(jp_fetch):
    return json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]


def tiny_estimate(demo_gguf, num_ctx=2048):  # the demo model trains on 2048
    return estimate(read_model_info(demo_gguf), EstimateOptions(num_ctx=num_ctx))


class TestSeed1DiscreteBeforeIntegrated:
    @pytest.fixture
    def simulated_devices(self):
        return [
            {
                "id": "GPU-igpu",
                "library": "Vulkan",
                "name": "Radeon 780M",
                "integrated": True,
                "total_memory": 32 * GiB,
                "free_memory": 30 * GiB,
            },
            {
                "id": "GPU-dgpu",
                "library": "Vulkan",
                "name": "RX 7600",
                "total_memory": 8 * GiB,
                "free_memory": 7 * GiB,
            },
        ]

    async def test_discrete_gpu_gets_the_model(self, jp_fetch, installed_model):
        assert (await generate(jp_fetch, "tiny"))["eval_count"] == 2
        (loaded,) = await ps(jp_fetch)
        devices = [a["device"] for a in loaded["allocations"]]
        assert devices == ["GPU-dgpu", "cpu"]
        assert loaded["size_vram"] > 0 and loaded["num_gpu_layers"] == 3
        # the memory it holds shows on the device
        data = json.loads((await jp_fetch("llm", "api", "devices")).body)
        dgpu = next(d for d in data["devices"] if d["id"] == "GPU-dgpu")
        assert dgpu["free_memory"] == 7 * GiB - loaded["size_vram"]


class TestSeed2CpuOutOfMemory:
    @pytest.fixture
    def simulated_system(self, demo_gguf):
        one = tiny_estimate(demo_gguf, 512).cpu_only_total
        return {"total_memory": 4 * one, "free_memory": int(1.6 * one)}

    async def test_evicts_then_fails_before_allocating(
        self, jp_fetch, jp_serverapp, installed_model, demo_gguf
    ):
        small = {"options": {"num_ctx": 512}}
        await generate(jp_fetch, "tiny", **small)
        await generate(jp_fetch, "tiny2", **small)  # two do not fit: tiny is evicted
        assert [m["name"] for m in await ps(jp_fetch)] == ["tiny2:latest"]

        with pytest.raises(HTTPClientError) as info:  # alone and still too big
            await generate(jp_fetch, "tiny3", options={"num_ctx": 2048})
        message = json.loads(info.value.response.body)["error"]
        assert info.value.code == 500
        assert message.startswith("model requires more system memory (")
        assert "than is available (" in message

        # the server and the other models keep working
        assert (await generate(jp_fetch, "tiny3", **small))["eval_count"] == 2


class TestSeed3ForcedNumGpu:
    @pytest.fixture
    def simulated_devices(self, demo_gguf):
        est = tiny_estimate(demo_gguf)
        one = MIN_GPU_BYTES + est.graph_full + sum(est.layer_size(i) for i in range(3))
        return [
            {
                "id": "GPU-0",
                "library": "CUDA",
                "name": "small",
                "total_memory": 2 * one,
                "free_memory": one + MiB,
            }
        ]

    async def test_evicts_others_then_loads_with_n_layers(self, jp_fetch, installed_model):
        await generate(jp_fetch, "tiny")
        assert (await ps(jp_fetch))[0]["num_gpu_layers"] == 3
        await generate(jp_fetch, "tiny2", options={"num_gpu": 2})
        (loaded,) = await ps(jp_fetch)
        assert loaded["name"] == "tiny2:latest" and loaded["num_gpu_layers"] == 2


class TestSeed3ForcedNumGpuTooBig:
    @pytest.fixture
    def simulated_devices(self):
        return [
            {
                "id": "GPU-0",
                "library": "CUDA",
                "name": "tiny",
                "total_memory": 500 * MiB,
                "free_memory": 400 * MiB,
            }
        ]

    async def test_alone_it_cannot_be_allocated(self, jp_fetch, installed_model):
        with pytest.raises(HTTPClientError) as info:
            await generate(jp_fetch, "tiny", options={"num_gpu": 2})
        assert json.loads(info.value.response.body)["error"] == (
            "memory layout cannot be allocated with num_gpu = 2"
        )
        assert await ps(jp_fetch) == []
        # automatic placement still works: CPU only on this GPU
        assert (await generate(jp_fetch, "tiny"))["eval_count"] == 2
        assert (await ps(jp_fetch))[0]["size_vram"] == 0


class TestSeed4NewEstimates:
    @pytest.fixture
    def llm_config(self):
        return {"new_estimates": True}

    async def test_ps_reports_what_llama_cpp_allocated(
        self, jp_fetch, jp_serverapp, installed_model
    ):
        await generate(jp_fetch, "tiny", options={"num_ctx": 1024})
        (loaded,) = await ps(jp_fetch)
        (cpu,) = loaded["allocations"]
        assert cpu["device"] == "cpu" and cpu["measured"] is True
        scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
        reported = scheduler.loaded_models()[0].runner.measured["cpu"]
        assert (cpu["weights"], cpu["kv_cache"], cpu["graph"]) == (
            reported["weights"],
            reported["kv_cache"],
            reported["graph"],
        )
        assert loaded["size"] == sum(reported.values())


class TestSeed4MeasuredOnSimulatedGpu:
    @pytest.fixture
    def llm_config(self):
        return {"new_estimates": True}

    @pytest.fixture
    def simulated_devices(self):
        return [
            {
                "id": "GPU-0",
                "library": "CUDA",
                "name": "sim",
                "total_memory": 8 * GiB,
                "free_memory": 8 * GiB,
            }
        ]

    async def test_measured_totals_spread_over_the_layout(
        self, jp_fetch, jp_serverapp, installed_model
    ):
        await generate(jp_fetch, "tiny")
        (loaded,) = await ps(jp_fetch)
        assert [a["device"] for a in loaded["allocations"]] == ["GPU-0", "cpu"]
        assert all(a["measured"] for a in loaded["allocations"])
        scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
        reported = scheduler.loaded_models()[0].runner.measured["cpu"]
        assert abs(loaded["size"] - sum(reported.values())) <= 3  # rounding only


async def test_seed5_loaded_runner_answers_free_memory_refresh(
    jp_fetch, jp_serverapp, installed_model
):
    services = jp_serverapp.web_app.settings["jupyter_llm"]
    discoveries = []
    original = services.devices._discover

    async def counting():
        discoveries.append(1)
        return await original()

    services.devices._discover = counting
    await generate(jp_fetch, "tiny")
    runner = services.scheduler.loaded_models()[0].runner
    asked = []
    original_info = runner.device_info

    async def counting_info():
        asked.append(1)
        return await original_info()

    runner.device_info = counting_info
    await generate(jp_fetch, "tiny2")
    await jp_fetch("llm", "api", "devices")
    assert len(discoveries) == 1  # one discovery runner, at the first placement
    assert asked  # afterwards the loaded runner is asked for free memory
