"""llama.cpp's log lines, read as allocations and allocation failures: tables of
lines as llama.cpp and ggml print them."""

import pytest

from jupyter_llm.memory import Allocation, Placement
from jupyter_llm.memory.measured import (
    AllocationLog,
    backend_names,
    is_allocation_failure_line,
    measured_allocations,
    parse_buffer_line,
)

MiB = 1 << 20


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("load_tensors:   CPU_Mapped model buffer size =    12.50 MiB", ("cpu", "weights", int(12.5 * MiB))),
        ("load_tensors:        CUDA0 model buffer size =  1024.00 MiB", ("CUDA0", "weights", 1024 * MiB)),
        ("llama_kv_cache:        CPU KV buffer size =    64.00 MiB", ("cpu", "kv_cache", 64 * MiB)),
        ("llama_context:  CUDA_Host  output buffer size =     0.98 MiB", ("cpu", "graph", int(0.98 * MiB))),
        ("sched_reserve:      Vulkan0 compute buffer size =   120.00 MiB", ("Vulkan0", "graph", 120 * MiB)),
        ("llama_context: n_ctx = 4096", None),
    ],
)  # fmt: skip
def test_parse_buffer_line(line, expected):
    assert parse_buffer_line(line) == expected


@pytest.mark.parametrize(
    ("line", "failure"),
    [
        ("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 4294967328", True),
        ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2048.00 MiB on device 0: cudaMalloc failed: out of memory", True),
        ("ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 1234567", True),
        ("llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache", True),
        ("ggml_vulkan: Device memory allocation of size 123 failed: ErrorOutOfDeviceMemory", True),
        ("sched_reserve: failed to reserve memory for the compute graph", True),
        ("llama_model_load: error loading model: invalid magic characters", False),
        ("load_tensors:   CPU_Mapped model buffer size =    12.50 MiB", False),
        ("print_info: file type   = F32", False),
    ],
)  # fmt: skip
def test_allocation_failure_lines(line, failure):
    assert is_allocation_failure_line(line) is failure


def test_allocation_log_sums_per_device_and_keeps_the_first_failure():
    log = AllocationLog()
    for line in (
        "load_tensors: CPU_Mapped model buffer size = 10.00 MiB",
        "load_tensors: CPU_REPACK model buffer size = 2.00 MiB",
        "llama_kv_cache: CPU KV buffer size = 4.00 MiB",
        "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 99",
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer",
    ):
        log.feed(line)
    assert log.devices == {"cpu": {"weights": 12 * MiB, "kv_cache": 4 * MiB, "graph": 0}}
    assert log.failure.endswith("failed to allocate buffer of size 99")
    log.reset()
    assert log.devices == {} and log.failure == ""


def test_measured_figures_replace_the_estimate_per_device():
    placement = Placement(
        gpu_layers=(("GPU-a", 30),),
        allocations=(Allocation("GPU-a", 900, 90, 9), Allocation("cpu", 100, 0, 1)),
        n_gpu_layers=30,
        n_layers=33,
    )
    names = backend_names("CUDA", placement.gpus)
    assert names == {"CUDA0": "GPU-a"}
    measured = {"CUDA0": {"weights": 800, "kv_cache": 80, "graph": 8}, "cpu": {"weights": 50}}
    assert measured_allocations(placement, measured, names) == (
        Allocation("GPU-a", 800, 80, 8),
        Allocation("cpu", 50, 0, 0),
    )
    # computed elsewhere (simulated GPUs): the totals spread in the layout's proportions
    spread = measured_allocations(placement, {"cpu": {"weights": 500, "kv_cache": 45}}, names)
    assert spread == (Allocation("GPU-a", 450, 45, 0), Allocation("cpu", 50, 0, 0))
    assert measured_allocations(placement, {}, names) is None


def test_what_a_runner_grew_goes_to_the_device_holding_it():
    from jupyter_llm.memory import Allocation
    from jupyter_llm.memory.measured import grown, merged, with_growth

    load = {"cpu": {"weights": 5, "kv_cache": 2, "graph": 1}}
    more = {"cpu": {"weights": 0, "kv_cache": 64, "graph": 65}}
    now = merged(load, more, {"CUDA0": {"graph": 7}})
    growth = grown(now, load)
    assert growth == {
        "cpu": {"weights": 0, "kv_cache": 64, "graph": 65},
        "CUDA0": {"weights": 0, "kv_cache": 0, "graph": 7},
    }
    layout = (Allocation("gpu-a", 10, 20, 30), Allocation("cpu", 1, 2, 3))
    assert with_growth(layout, growth, {"CUDA0": "gpu-a"}) == (
        Allocation("gpu-a", 10, 20, 37),
        Allocation("cpu", 1, 66, 68),
    )
    # a buffer on a device the layout does not hold (simulated GPUs): the CPU's
    assert with_growth(layout[1:], growth, {}) == (Allocation("cpu", 1, 66, 75),)
    assert grown(load, load) == {}


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"cpu": {"weights": 1, "kv_cache": 0, "graph": 2}}, True),
        ({}, True),
        ({"cpu": {"weights": -1}}, False),
        ({"cpu": {"other": 1}}, False),
        ({"cpu": {"graph": 1.5}}, False),
        ({"cpu": {"graph": True}}, False),
        ({"cpu": [1]}, False),
        ([], False),
        (None, False),
    ],
)
def test_what_a_runner_says_it_holds_is_checked(value, ok):
    from jupyter_llm.memory.measured import is_sizes

    assert is_sizes(value) is ok
