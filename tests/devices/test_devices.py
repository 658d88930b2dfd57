import json

import pytest

from jupyter_llm.devices import (
    DeviceInfo,
    DeviceSource,
    device_from_raw,
    gpu_max_tensor,
    sort_devices,
)
from jupyter_llm.devices.nvml import overlay_nvml
from jupyter_llm.devices.simulated import parse_simulated_devices, parse_simulated_system
from jupyter_llm.devices.system import cap_by_cgroup
from jupyter_llm.devices.types import without_our_use
from jupyter_llm.request.errors import ConfigError

GiB = 1 << 30


def gpu(id, free, integrated=False, library="CUDA"):
    return DeviceInfo(
        id=id,
        library=library,
        name=id,
        integrated=integrated,
        total_memory=free * 2,
        free_memory=free,
    )


def test_discrete_before_integrated_even_with_less_free_memory():
    igpu = gpu("igpu", 32 * GiB, integrated=True, library="Vulkan")
    small = gpu("small", 4 * GiB)
    big = gpu("big", 8 * GiB)
    cpu = DeviceInfo(id="cpu", library="CPU", name="CPU", free_memory=64 * GiB)
    assert [d.id for d in sort_devices([cpu, igpu, small, big])] == ["big", "small", "igpu", "cpu"]


def test_simulated_devices_parsed_and_sorted():
    raw = json.dumps(
        [
            {
                "id": "GPU-i",
                "library": "Vulkan",
                "name": "iGPU",
                "total_memory": 32 * GiB,
                "free_memory": 30 * GiB,
                "integrated": True,
            },
            {
                "id": "GPU-d",
                "library": "CUDA",
                "name": "RTX",
                "total_memory": 8 * GiB,
                "free_memory": 7 * GiB,
            },
        ]
    )
    devices = sort_devices(parse_simulated_devices(raw))
    assert [d.name for d in devices] == ["RTX", "iGPU"]
    assert devices[1].integrated


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "{}",
        '[{"id": "x"}]',
        '[{"id":"a","library":"CUDA","name":"n","total_memory":1,"free_memory":2}]',
        '[{"id":"a","library":"CUDA","name":"n","total_memory":-1,"free_memory":0}]',
    ],
)
def test_simulated_devices_bad_input(raw):
    with pytest.raises(ConfigError):
        parse_simulated_devices(raw)


def test_simulated_system():
    info = parse_simulated_system('{"total_memory": 100, "free_memory": 40}', threads=2)
    assert (info.total_memory, info.free_memory, info.threads) == (100, 40, 2)
    with pytest.raises(ConfigError):
        parse_simulated_system('{"total_memory": 1}', threads=2)


@pytest.mark.parametrize(
    ("total", "free", "limit", "expected"),
    [
        (100, 80, None, (100, 80)),
        (100, 80, (50, 20), (50, 30)),
        (100, 10, (50, 20), (50, 10)),
        (100, 80, (50, 60), (50, 0)),
    ],
)
def test_cgroup_cap(total, free, limit, expected):
    assert cap_by_cgroup(total, free, limit) == expected


def test_nvml_overlay_by_pci_id():
    dev = DeviceInfo(
        id="0000:01:00.0",
        library="CUDA",
        name="g",
        pci_id="0000:01:00.0",
        total_memory=1,
        free_memory=1,
    )
    vk = DeviceInfo(id="v", library="Vulkan", name="v", total_memory=1, free_memory=1)
    out = overlay_nvml([dev, vk], {"00000000:01:00.0": (5, 10, "550.1")})
    assert (out[0].free_memory, out[0].total_memory, out[0].driver) == (5, 10, "550.1")
    assert out[1] == vk


def test_device_from_raw():
    d = device_from_raw(
        {
            "index": 1,
            "name": "Vulkan0",
            "description": "Intel UHD",
            "type": "igpu",
            "library": "Vulkan",
            "free_memory": 5,
            "total_memory": 9,
            "pci_id": "",
        }
    )
    assert d.integrated and d.library == "Vulkan" and d.id == "Vulkan0"
    assert device_from_raw({"name": "CPU", "type": "cpu", "library": "CPU"}).library == "CPU"


async def test_device_source_simulated_ignores_hardware():
    async def discover():
        raise AssertionError("no discovery with simulated devices")

    env = {
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(
            [
                {
                    "id": "i",
                    "library": "Vulkan",
                    "name": "i",
                    "total_memory": 9,
                    "free_memory": 9,
                    "integrated": True,
                },
                {"id": "d", "library": "CUDA", "name": "d", "total_memory": 4, "free_memory": 3},
            ]
        ),
        "JUPYTER_LLM_SIMULATED_SYSTEM": '{"total_memory": 1000, "free_memory": 500}',
    }
    source = DeviceSource(discover, environ=env)
    devices = await source.devices()
    assert [d.id for d in devices] == ["d", "i", "cpu"]
    assert devices[-1].free_memory == 500


@pytest.mark.parametrize(
    ("total", "reported_free", "ours", "free"),
    [
        (8, 8, 3, 5),  # lavapipe: the whole heap reported free whatever is allocated
        (8, 5, 3, 5),  # a driver that already counts our 3
        (8, 4, 3, 4),  # ... and another process's 1
        (8, 6, 0, 6),  # nothing of ours there
        (8, 8, 9, 0),  # more than the total (estimates): never below zero
        (0, 4, 3, 4),  # no total reported: nothing to go by
    ],
)
def test_free_memory_never_above_total_less_ours(total, reported_free, ours, free):
    device = DeviceInfo(id="g", library="Vulkan", name="g", total_memory=total * GiB,
                        free_memory=reported_free * GiB)  # fmt: skip
    assert without_our_use(device, ours * GiB).free_memory == free * GiB


async def test_device_source_counts_our_runners_on_a_gpu_that_does_not():
    lavapipe = DeviceInfo(id="Vulkan0", library="Vulkan", name="Vulkan0",
                          total_memory=2 * GiB, free_memory=2 * GiB)  # fmt: skip
    cpu = DeviceInfo(id="cpu", library="CPU", name="CPU")

    async def discover():
        return [lavapipe, cpu]

    source = DeviceSource(discover, environ={})
    (gpu_now, _) = await source.devices(used={"Vulkan0": GiB // 2, "cpu": GiB})
    assert gpu_now.id == "Vulkan0" and gpu_now.free_memory == 3 * GiB // 2
    (gpu_idle, _) = await source.devices()
    assert gpu_idle.free_memory == 2 * GiB


@pytest.mark.parametrize(
    ("library", "description", "limit"),
    [
        ("Vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", 128 << 20),
        ("Vulkan", "NVIDIA GeForce RTX 4090", 0),
        ("CUDA", "llvmpipe", 0),
    ],
)
def test_max_tensor(library, description, limit):
    device = DeviceInfo(id="g", library=library, name="g", description=description)
    assert device.max_tensor == limit
    assert gpu_max_tensor([device, DeviceInfo(id="h", library="CUDA", name="h")]) == limit
