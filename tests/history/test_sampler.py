"""The sampler with the scheduler and devices replaced (the API test runs it
for real): what one sample holds, rates from the tally between samples, a
failed read that costs one point and not the task; and NVML's utilization
read through a stand-in ``pynvml`` (no NVIDIA driver on the test machines)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
from waiting import until

from jupyter_llm.devices import DeviceInfo, DeviceSource
from jupyter_llm.devices import nvml as nvml_module
from jupyter_llm.history.sampler import DEVICES_EVERY, HistorySampler
from jupyter_llm.history.tokens import TokenTally

GPU = DeviceInfo("GPU-0", "CUDA", "Sim", total_memory=8, free_memory=4)
CPU = DeviceInfo("cpu", "CPU", "CPU", total_memory=16, free_memory=8)


class Scheduler:
    def __init__(self) -> None:
        self.fail = False
        self.asked = 0
        alloc = SimpleNamespace(device="GPU-0", total=3)
        self.models = [SimpleNamespace(key="m", node="", allocations=(alloc,))]

    async def current_devices(self):
        self.asked += 1
        if self.fail:
            raise RuntimeError("runner gone")
        return [GPU, CPU]

    def loaded_models(self):
        return self.models


class Devices:
    async def utilization(self, devices):
        return {"GPU-0": 55.0}


async def test_a_sample_and_the_rate_between_two():
    tally = TokenTally()
    clock = iter([100.0, 102.0])
    sampler = HistorySampler(Scheduler(), Devices(), tally=tally, clock=lambda: next(clock))
    first = await sampler.sample()
    assert first.memory == {"GPU-0": {"m": 3}, "cpu": {}}
    assert first.utilization == {"GPU-0": 55.0} and first.tokens_per_second == {}
    tally.add("m", 40)
    second = await sampler.sample()
    assert second.t == 102.0 and second.tokens_per_second["m"] > 0
    assert [s.t for s in sampler.ring.samples()] == [100.0, 102.0]
    assert sampler.ring.devices[0] == {
        "id": "GPU-0", "name": "Sim", "library": "CUDA", "total_memory": 8,
    }  # fmt: skip


async def test_devices_are_read_again_when_models_change_or_now_and_then():
    scheduler = Scheduler()
    sampler = HistorySampler(scheduler, Devices())
    for _ in range(3):
        await sampler.sample()
    assert scheduler.asked == 1  # the same models: the list from the first sample
    alloc = SimpleNamespace(device="GPU-0", total=2)
    scheduler.models = [*scheduler.models, SimpleNamespace(key="n", node="", allocations=(alloc,))]
    sample = await sampler.sample()
    assert scheduler.asked == 2 and sample.memory["GPU-0"] == {"m": 3, "n": 2}
    for _ in range(DEVICES_EVERY):
        await sampler.sample()
    assert scheduler.asked == 3


async def test_a_failed_read_costs_a_point_not_the_task():
    scheduler = Scheduler()
    scheduler.fail = True
    sampler = HistorySampler(scheduler, Devices(), interval=0.01)
    sampler.start()
    try:
        await until(lambda: sampler.running, what="the sampler to start")
        scheduler.fail = False
        await until(lambda: len(sampler.ring) >= 2, what="samples after the failure")
        assert sampler.running
    finally:
        await sampler.stop()
    assert not sampler.running


class FakeNVML:
    """Two GPUs as pynvml reports them (bytes or str, as versions differ)."""

    def __init__(self) -> None:
        self.gpus = [(b"GPU-aa", b"00000000:01:00.0", 12), ("GPU-bb", "00000000:02:00.0", 90)]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, i):
        return SimpleNamespace(gpu=self.gpus[i][2], memory=0)

    def nvmlDeviceGetUUID(self, i):
        return self.gpus[i][0]

    def nvmlDeviceGetPciInfo(self, i):
        return SimpleNamespace(busId=self.gpus[i][1])


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.setattr(nvml_module, "_state", {})
    yield
    nvml_module._state.clear()


async def test_utilization_from_nvml(fake_nvml):
    assert nvml_module.nvml_utilization() == {
        "gpu-aa": 12.0, "00000000:01:00.0": 12.0, "gpu-bb": 90.0, "00000000:02:00.0": 90.0,
    }  # fmt: skip
    source = DeviceSource(lambda: None, environ={})
    gpus = [DeviceInfo("GPU-aa", "CUDA", "A"), DeviceInfo("x", "CUDA", "B", pci_id="0000:02:00.0")]
    assert await source.utilization([*gpus, CPU]) == {"GPU-aa": 12.0, "x": 90.0}
    # no CUDA device: NVML is not asked
    assert await source.utilization([DeviceInfo("v", "Vulkan", "V"), CPU]) == {}


async def test_simulated_utilization_replaces_nvml():
    device = {"id": "GPU-0", "library": "CUDA", "name": "S", "total_memory": 8, "free_memory": 8}
    raw = json.dumps([{**device, "utilization": 7}])
    source = DeviceSource(lambda: None, environ={"JUPYTER_LLM_SIMULATED_DEVICES": raw})
    assert await source.utilization([GPU]) == {"GPU-0": 7.0}
