"""From a placement to a runner's launch, and which GPUs serve: pure tables."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceInfo, serving_gpus
from jupyter_llm.memory import Allocation, Placement
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner_client.launch import LoadRequest, gpu_library, launch_spec, visibility_env
from jupyter_llm.scheduler import LoadOptions, policy

GiB = 1 << 30


def gpu(id, library="CUDA", free=8, integrated=False):
    return DeviceInfo(id, library, id, integrated=integrated, free_memory=free * GiB)


CPU = DeviceInfo("cpu", "CPU", "CPU", free_memory=64 * GiB)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([CPU], []),
        ([CPU, gpu("a", free=4), gpu("b", free=8)], ["b", "a"]),  # most free first
        ([gpu("v", "Vulkan", 16), gpu("c", "CUDA", 8)], ["v"]),  # the best GPU's library
        ([gpu("i", "Vulkan", 64, True), gpu("c", "CUDA", 8)], ["c"]),  # discrete first
        ([gpu("c0", free=2), gpu("v", "Vulkan", 4, True), gpu("c1", free=1)], ["c0", "c1"]),
    ],
)
def test_serving_gpus(devices, expected):
    assert [d.id for d in serving_gpus(devices)] == expected


@pytest.mark.parametrize(
    ("library", "indices", "parent", "expected"),
    [
        ("CUDA", [0, 2], {}, (("CUDA_VISIBLE_DEVICES", "0,2"),)),
        (
            "CUDA",
            [1],
            {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
            (("CUDA_VISIBLE_DEVICES", "GPU-b"),),
        ),
        ("ROCm", [0], {}, (("HIP_VISIBLE_DEVICES", "0"),)),
        ("Vulkan", [1], {}, (("GGML_VK_VISIBLE_DEVICES", "1"),)),
        ("Metal", [0], {}, ()),
    ],
)
def test_visibility_env(library, indices, parent, expected):
    assert visibility_env(library, indices, parent) == expected


def placement(*gpu_layers):
    gpus = [Allocation(d, GiB, 0, 0) for d, _ in gpu_layers]
    allocations = (*gpus, Allocation("cpu", GiB, 0, 0))
    n = sum(layers for _, layers in gpu_layers)
    return Placement(tuple(gpu_layers), allocations, n_gpu_layers=n, n_layers=33)


def request(place, gpus=(), simulated=False, parallel=1):
    return LoadRequest(
        path="/m.gguf",
        num_ctx=2048,
        num_batch=512,
        num_thread=0,
        use_mmap=True,
        parallel=parallel,
        placement=place,
        gpus=tuple(gpus),
        simulated=simulated,
    )


@pytest.mark.parametrize(
    ("req", "environ", "n_gpu_layers", "tensor_split", "env"),
    [
        (request(placement()), {}, 0, (), ()),  # CPU only
        # on the CPU alone beside GPUs: every GPU hidden, else they take the big products
        (request(placement(), [gpu("a"), gpu("b")]), {}, 0, (), (("CUDA_VISIBLE_DEVICES", ""),)),
        (
            request(placement(), [gpu("a"), gpu("v", "Vulkan"), gpu("m", "Metal")]),
            {"CUDA_VISIBLE_DEVICES": "3"},
            0,
            (),
            (("CUDA_VISIBLE_DEVICES", ""), ("GGML_VK_VISIBLE_DEVICES", "")),
        ),
        (
            request(placement(("b", 33)), [gpu("a"), gpu("b")]),
            {},
            33,
            (),
            (("CUDA_VISIBLE_DEVICES", "1"),),
        ),
        (
            request(placement(("a", 20), ("b", 13)), [gpu("a"), gpu("b")]),
            {"CUDA_VISIBLE_DEVICES": "3,5"},
            33,
            (20.0, 13.0),
            (("CUDA_VISIBLE_DEVICES", "3,5"),),
        ),
        (
            request(placement(("v", 10)), [gpu("v", "Vulkan")]),
            {},
            10,
            (),
            (("GGML_VK_VISIBLE_DEVICES", "0"),),
        ),
        (request(placement(("a", 33)), [gpu("a")], simulated=True), {}, 0, (), ()),
    ],
)
def test_launch_spec(req, environ, n_gpu_layers, tensor_split, env):
    spec = launch_spec(req, environ)
    assert (spec.n_gpu_layers, spec.tensor_split, spec.env) == (n_gpu_layers, tensor_split, env)
    assert spec.n_ctx == 2048 and spec.path == "/m.gguf"


def test_parallel_sequences_share_one_kv_cache():
    spec = launch_spec(request(placement(), parallel=4), {})
    assert (spec.n_ctx, spec.n_seq) == (2048, 4)


def test_gpu_library():
    assert gpu_library(request(placement())) == ""
    assert gpu_library(request(placement(("v", 3)), [gpu("v", "Vulkan")])) == "Vulkan"


@pytest.mark.parametrize("flash_attn", ["auto", "on", "off"])
def test_the_flash_attention_setting_reaches_the_load_message(flash_attn):
    settings = Settings(flash_attention=flash_attn)
    model = SimpleNamespace(context_length=0)  # what ``wanted`` reads of a model
    entry = SimpleNamespace(model_path=Path("/m.gguf"), projector_path=None, draft_path=None)
    wanted = policy.wanted(LoadOptions(), model, settings)  # type: ignore[arg-type]
    req = policy.load_request(entry, wanted, 1, placement(), [CPU], simulated=False)  # type: ignore[arg-type]
    assert launch_spec(req, {}).load_params == LoadParams(
        path="/m.gguf", n_ctx=settings.context_length, n_batch=512, flash_attn=flash_attn
    )
