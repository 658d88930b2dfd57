"""Estimate and layout: pure, table-driven."""

import dataclasses

import pytest
from fakes import synthetic_model

from jupyter_llm.memory import (
    MIN_GPU_BYTES,
    CannotAllocateForced,
    DoesNotFit,
    EstimateOptions,
    GpuSlot,
    NeedsSystemMemory,
    estimate,
    plan_layout,
)
from jupyter_llm.memory.estimate import swa_cells, swa_layers
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.memory.outputs import output_growth, output_rows
from jupyter_llm.request.priority import seq_ids

MiB, GiB = 1 << 20, 1 << 30

# a 7B-like model: 32 blocks of 200 MiB, 250 MiB output, 250 MiB input embeddings
MODEL = synthetic_model(200, 32, context_length=8192)
EST = estimate(MODEL, EstimateOptions(num_ctx=4096))
FULL_ON_ONE = sum(EST.layer_size(i) for i in range(33)) + EST.gpu_graph_full + MIN_GPU_BYTES


def gpu(id, free, integrated=False):
    return GpuSlot(
        id=id, library="Vulkan" if integrated else "CUDA", free=free, integrated=integrated
    )


@pytest.mark.parametrize(
    ("kv_type", "per_layer"),
    [
        ("f16", 4096 * 256 * 8 * 2),
        ("f32", 4096 * 256 * 8 * 4),
        ("q8_0", 4096 * 256 * 8 * 34 // 32),  # ggml blocks: 34 bytes per 32 values
        ("q4_0", 4096 * 256 * 8 * 18 // 32),
        ("q5_1", 4096 * 256 * 8 * 24 // 32),
    ],
)
def test_kv_cache_per_layer(kv_type, per_layer):
    est = estimate(MODEL, EstimateOptions(num_ctx=4096, kv_type=kv_type))
    assert est.layer_kv == (per_layer,) * 32


def test_kv_scales_with_ctx():
    one = estimate(MODEL, EstimateOptions(num_ctx=2048)).kv_total
    assert estimate(MODEL, EstimateOptions(num_ctx=4096)).kv_total == 2 * one
    # the cache is allocated in multiples of 256 cells
    assert estimate(MODEL, EstimateOptions(num_ctx=1000)).kv_total == one // 2


def test_graph_grows_with_context():
    small = estimate(MODEL, EstimateOptions(num_ctx=2048))
    big = estimate(MODEL, EstimateOptions(num_ctx=8192))
    assert big.graph_full > small.graph_full and big.graph_partial > small.graph_partial
    for kind in ("gpu_graph_full", "gpu_graph_partial", "host_graph_full", "host_graph_partial"):
        assert getattr(big, kind) > getattr(small, kind), kind


def test_unknown_kv_type():
    with pytest.raises(ValueError):
        estimate(MODEL, EstimateOptions(kv_type="q2"))


def test_cpu_only_when_no_gpu():
    p = plan_layout(EST, [], system_free=64 * GiB)
    assert p.n_gpu_layers == 0 and p.gpus == []
    assert p.allocations[-1].device == "cpu" and p.total == EST.cpu_only_total


def test_full_fit_on_one_gpu():
    p = plan_layout(EST, [gpu("a", FULL_ON_ONE + MiB)], system_free=64 * GiB)
    assert p.n_gpu_layers == 33 and p.gpus == ["a"]
    # only the input embeddings stay on the CPU, and the host's compute buffer
    assert p.on("cpu") == EST.input_weights + EST.host_graph_full


def test_discrete_used_before_integrated_with_more_free_memory():
    # sorted order is the caller's (devices.sort_devices): dGPU first
    p = plan_layout(
        EST, [gpu("d", FULL_ON_ONE + MiB), gpu("i", 4 * FULL_ON_ONE, True)], system_free=64 * GiB
    )
    assert p.gpus == ["d"]


def test_fewest_gpus_that_hold_everything():
    gpus = [
        gpu("a", FULL_ON_ONE // 2 + GiB),
        gpu("b", FULL_ON_ONE // 2 + GiB),
        gpu("c", FULL_ON_ONE // 2 + GiB),
    ]
    p = plan_layout(EST, gpus, system_free=64 * GiB)
    assert p.n_gpu_layers == 33 and p.gpus == ["a", "b"]
    assert p.tensor_split == [float(n) for _, n in p.gpu_layers]


def test_partial_offload_when_alone():
    p = plan_layout(EST, [gpu("a", FULL_ON_ONE // 2)], system_free=64 * GiB)
    assert 0 < p.n_gpu_layers < 33
    assert p.on("cpu") > EST.input_weights


def test_require_full_refuses_partial():
    with pytest.raises(DoesNotFit):
        plan_layout(EST, [gpu("a", FULL_ON_ONE // 2)], system_free=64 * GiB, require_full=True)


def test_gpu_too_small_for_two_layers_is_not_used():
    p = plan_layout(
        EST, [gpu("a", MIN_GPU_BYTES + EST.gpu_graph_partial + 300 * MiB)], system_free=64 * GiB
    )
    assert p.n_gpu_layers == 0


@pytest.mark.parametrize("n", [1, 5, 33])
def test_forced_num_gpu(n):
    p = plan_layout(EST, [gpu("a", 2 * FULL_ON_ONE)], system_free=64 * GiB, num_gpu=n)
    assert p.n_gpu_layers == n


def test_forced_num_gpu_that_cannot_be_allocated():
    with pytest.raises(CannotAllocateForced, match="num_gpu = 20"):
        plan_layout(EST, [gpu("a", FULL_ON_ONE // 3)], system_free=64 * GiB, num_gpu=20)


def test_num_gpu_zero_is_cpu_only():
    p = plan_layout(EST, [gpu("a", 2 * FULL_ON_ONE)], system_free=64 * GiB, num_gpu=0)
    assert p.n_gpu_layers == 0


def test_cpu_part_larger_than_system_memory():
    with pytest.raises(NeedsSystemMemory) as info:
        plan_layout(EST, [], system_free=2 * GiB)
    assert "model requires more system memory (" in str(info.value)
    assert "than is available (2.0 GiB)" in str(info.value)


def test_gpu_overhead_reduces_room():
    free = FULL_ON_ONE + MiB
    assert plan_layout(EST, [gpu("a", free)], 64 * GiB).n_gpu_layers == 33
    assert plan_layout(EST, [gpu("a", free)], 64 * GiB, gpu_overhead=GiB).n_gpu_layers < 33


def test_model_info_from_demo_gguf(demo_gguf):
    info = read_model_info(demo_gguf)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (
        "llama",
        2,
        64,
        4,
        2,
    )
    assert info.head_dim_k == 16 and info.n_vocab == 265  # 256 bytes, 2 merges, 7 specials
    assert info.output_bytes == 265 * 64 * 4 + 64 * 4
    assert sum(info.layer_bytes) > 0 and info.input_bytes == 265 * 64 * 4


@pytest.mark.parametrize(
    ("arch", "n_layer", "n_swa", "pattern", "windowed"),
    [
        ("llama", 4, 4096, None, "...."),  # no SWA in llama.cpp for this architecture
        ("gemma3", 4, 0, None, "...."),  # no window: every layer global
        ("gemma3", 12, 512, None, "sssss.sssss."),  # 5 windowed, 1 global
        ("gemma2", 4, 4096, None, "s.s."),
        ("cohere2", 8, 4096, None, "sss.sss."),
        ("cohere2moe", 8, 4096, None, ".sss.sss"),  # dense first
        ("gpt-oss", 4, 128, None, "s.s."),
        ("llama4", 8, 8192, None, "sss.sss."),  # chunked attention
        ("gemma3", 6, 512, 3, "ss.ss."),  # the GGUF's pattern wins
    ],
)
def test_swa_layers(arch, n_layer, n_swa, pattern, windowed):
    got = swa_layers(arch, n_layer, n_swa, pattern)
    assert "".join("s" if w else "." for w in got) == windowed


@pytest.mark.parametrize(
    ("context", "n_swa", "n_seq", "n_ubatch", "unified", "cells"),
    [
        (32768, 512, 4, 512, True, 2560),  # window per sequence + a ubatch
        (32768, 512, 1, 512, True, 1024),
        (32768, 512, 4, 512, False, 1024),  # each stream its own window
        (2048, 512, 4, 512, True, 2048),  # never more than the context
        (32768, 500, 1, 100, True, 768),  # padded to 256 cells
    ],
)
def test_swa_cells(context, n_swa, n_seq, n_ubatch, unified, cells):
    assert swa_cells(context, n_swa, n_seq, n_ubatch, unified) == cells


def _gemma_like(tied: bool):
    return dataclasses.replace(
        synthetic_model(10, 6, n_embd=640, n_head=4, n_head_kv=1, edge_mib=160),
        architecture="gemma3",
        head_dim_k=256,
        head_dim_v=256,
        n_swa=512,
        tied_embeddings=tied,
    )


def test_swa_kv_windowed_and_full():
    model = _gemma_like(tied=True)
    per_cell = 2 * 256 * 2  # K and V, one head of 256, f16
    est = estimate(model, EstimateOptions(num_ctx=32768, num_parallel=4))
    # a window per sequence id: 4 slots and 4 spare ids for paused batch work, and a ubatch
    assert est.layer_kv == ((512 * 8 + 512) * per_cell,) * 5 + (32768 * per_cell,)
    full = estimate(model, EstimateOptions(num_ctx=32768, num_parallel=4, swa_full=True))
    assert full.layer_kv == (32768 * per_cell,) * 6


@pytest.mark.parametrize(("tied", "edges"), [(True, 1), (False, 2)])
def test_tied_embeddings_counted_once_on_the_cpu(tied, edges):
    est = estimate(_gemma_like(tied), EstimateOptions(num_ctx=2048))
    cpu = plan_layout(est, [], system_free=1 << 50).allocations[-1]
    assert cpu.weights == 6 * 10 * MiB + edges * 160 * MiB
    assert est.weights_total == cpu.weights


def test_tied_output_duplicated_when_offloaded():
    est = estimate(_gemma_like(tied=True), EstimateOptions(num_ctx=2048))
    placement = plan_layout(est, [gpu("GPU-0", 8 * GiB)], system_free=1 << 50)
    on_gpu, cpu = placement.allocations
    assert on_gpu.weights == 6 * 10 * MiB + 160 * MiB  # the output copy
    assert cpu.weights == 160 * MiB  # token_embd stays for the input


def test_model_info_of_gemma(gemma_gguf):
    info = read_model_info(gemma_gguf)
    assert (info.architecture, info.n_swa, info.tied_embeddings) == ("gemma3", 512, True)
    assert info.n_vocab == 262144
    assert sum(swa_layers(info.architecture, info.n_layer, info.n_swa)) == 15


def demo_info(n_embd, n_layer, n_ff, n_head, n_head_kv, n_vocab, layer_bytes):
    """A generated (f32 llama) model's shape, as read_model_info reads it."""
    return dataclasses.replace(
        synthetic_model(1, n_layer, context_length=32768),
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=n_embd // n_head,
        head_dim_v=n_embd // n_head,
        n_vocab=n_vocab,
        layer_bytes=(layer_bytes,) * n_layer,
        output_bytes=4 * n_vocab * n_embd + 4 * n_embd,
    )


SMALL = demo_info(512, 8, 1536, 8, 8, 265, 13635584)  # tests/vulkan's small_gguf
VOCAB_20K = demo_info(512, 8, 1536, 8, 8, 20265, 13635584)
GQA_1024 = demo_info(1024, 6, 2816, 16, 4, 265, 45096960)
VOCAB_50K = demo_info(256, 4, 768, 4, 4, 50265, 3409920)
WIDE_2048 = demo_info(2048, 3, 5632, 16, 16, 8265, 205537280)


def grown(model, num_batch: int) -> float:
    """MiB the host's logits buffer grows by after the load (memory.outputs),
    at 4 sequences: the tables hold what the load logged, the estimate what
    the runner holds (its load reports the same growth)."""
    ids = seq_ids(4)
    return output_growth(model.n_vocab, output_rows(num_batch, 4, ids), ids) / MiB


# What ggml-vulkan on lavapipe reserved (sched_reserve's compute buffers plus
# the output buffer; llama-cpp-python 0.3.36, flash attention auto, 4
# sequences), in MiB: the GPU's compute buffer, the host's (Vulkan_Host).
# Split: the model's last few layers on the GPU, the others on the CPU.
@pytest.mark.parametrize(
    ("model", "num_ctx", "num_batch", "split", "gpu_mib", "host_mib"),
    [
        (SMALL, 2048, 512, False, 13.01, 4.02),
        (SMALL, 2048, 512, True, 15.0, 5.02),
        (SMALL, 1024, 512, False, 12.01, 3.01),
        (SMALL, 1024, 512, True, 14.0, 4.01),
        (SMALL, 512, 512, False, 11.51, 2.51),
        (SMALL, 2048, 256, False, 6.51, 2.01),
        (SMALL, 2048, 256, True, 10.0, 2.51),
        (VOCAB_20K, 2048, 512, False, 13.01, 4.63),
        (VOCAB_20K, 2048, 512, True, 15.0, 5.63),
        (VOCAB_20K, 8192, 512, False, 19.01, 10.63),
        (VOCAB_20K, 4096, 512, True, 19.0, 7.63),
        (GQA_1024, 2048, 512, False, 22.51, 6.01),
        (GQA_1024, 2048, 512, True, 34.0, 6.01),
        (GQA_1024, 8192, 512, False, 28.51, 12.01),
        (GQA_1024, 8192, 512, True, 40.5, 12.01),
        (GQA_1024, 2048, 256, True, 22.5, 3.01),
        (VOCAB_50K, 4096, 512, False, 13.17, 6.54),
        (VOCAB_50K, 4096, 512, True, 13.11, 7.04),
        (WIDE_2048, 4096, 512, False, 45.01, 12.26),
        (WIDE_2048, 1024, 512, False, 42.01, 9.26),
        (WIDE_2048, 1024, 512, True, 90.0, 13.26),
    ],
)
def test_gpu_graphs_match_ggml_vulkan(model, num_ctx, num_batch, split, gpu_mib, host_mib):
    est = estimate(model, EstimateOptions(num_ctx=num_ctx, num_batch=num_batch))
    gpu = est.gpu_graph_partial if split else est.gpu_graph_full
    host = est.host_graph_partial if split else est.host_graph_full
    host_mib += grown(model, num_batch)
    assert abs(gpu / MiB - gpu_mib) <= 0.10 * gpu_mib
    assert abs(host / MiB - host_mib) <= 0.10 * host_mib


# Measured splits still off: a partial offload's GPU peak is the fragmented
# best fit of the CPU layers' weight copies among the activations
@pytest.mark.parametrize(
    ("model", "num_ctx", "gpu_mib"),
    [(SMALL, 512, 12.5), (WIDE_2048, 4096, 79.0)],
)
def test_gpu_graph_split_within_twenty_percent(model, num_ctx, gpu_mib):
    est = estimate(model, EstimateOptions(num_ctx=num_ctx))
    assert abs(est.gpu_graph_partial / MiB - gpu_mib) <= 0.20 * gpu_mib


# Past about 4k cells a split's GPU peak is the CPU layers' attention, run
# on the GPU with their K and V over every cell copied there (as the
# scheduler's debug output lists its splits' inputs), beside the masks.
# Measured on lavapipe: (gpu MiB), a batch of 512 unless given.
@pytest.mark.parametrize(
    ("model", "num_ctx", "num_batch", "gpu_mib"),
    [
        (SMALL, 8192, 512, 35.0),
        (VOCAB_20K, 8192, 512, 35.0),
        (SMALL, 16384, 512, 67.0),
        (SMALL, 32768, 512, 131.0),
        (SMALL, 32768, 256, 82.0),
        (SMALL, 32768, 128, 73.5),
        (GQA_1024, 32768, 512, 72.0),
        (GQA_1024, 32768, 256, 54.0),
        (WIDE_2048, 16384, 512, 168.0),
    ],
)
def test_gpu_graph_split_at_long_contexts(model, num_ctx, num_batch, gpu_mib):
    est = estimate(model, EstimateOptions(num_ctx=num_ctx, num_batch=num_batch))
    assert abs(est.gpu_graph_partial / MiB - gpu_mib) <= 0.15 * gpu_mib


def test_layout_charges_the_gpu_graphs():
    est = estimate(SMALL, EstimateOptions(num_ctx=2048))
    big = gpu("a", 64 * GiB)
    full = plan_layout(est, [big], system_free=64 * GiB)
    assert [a.graph for a in full.allocations] == [est.gpu_graph_full, est.host_graph_full]
    split = plan_layout(est, [big], system_free=64 * GiB, num_gpu=4)
    assert [a.graph for a in split.allocations] == [est.gpu_graph_partial, est.host_graph_partial]
    alone = plan_layout(est, [], system_free=64 * GiB)
    assert [a.graph for a in alone.allocations] == [est.graph_full]


VOCAB_70K = demo_info(256, 2, 768, 4, 4, 70265, 3409920)
LAVAPIPE = 128 * MiB  # its storage buffer range


# Past the GPU's tensor limit, on lavapipe (every layer offloaded): (gpu, host)
# compute MiB, the output matrix on the GPU
@pytest.mark.parametrize(
    ("model", "num_ctx", "num_batch", "gpu_mib", "host_mib", "matrix_on_gpu"),
    [
        # its 69 MiB matrix is kept off the GPU (512 probe tokens' logits are
        # past it), but a step's 68 rows of logits (18 MiB) are not: the GPU
        # runs the product, the matrix copied there
        (VOCAB_70K, 2048, 512, 86.98, 5.15, False),
        (VOCAB_50K, 4096, 512, 13.17, 6.54, True),  # under it: as without a limit
    ],
)
def test_gpu_graphs_past_the_tensor_limit(
    model, num_ctx, num_batch, gpu_mib, host_mib, matrix_on_gpu
):
    opts = EstimateOptions(num_ctx=num_ctx, num_batch=num_batch, gpu_max_tensor=LAVAPIPE)
    est = estimate(model, opts)
    host_mib += grown(model, num_batch)
    assert abs(est.gpu_graph_full / MiB - gpu_mib) <= 0.10 * gpu_mib
    assert abs(est.host_graph_full / MiB - host_mib) <= 0.10 * host_mib
    assert est.output_on_cpu is not matrix_on_gpu


def test_an_output_matrix_the_gpu_refuses_stays_on_the_cpu():
    est = estimate(VOCAB_70K, EstimateOptions(num_ctx=2048, gpu_max_tensor=LAVAPIPE))
    p = plan_layout(est, [gpu("a", 64 * GiB)], system_free=64 * GiB)
    assert p.n_gpu_layers == 3  # llama.cpp's count still has the output layer
    on_gpu, cpu = p.allocations
    assert on_gpu.weights == sum(est.layer_weights)
    assert cpu.weights == est.input_weights + est.output_weights


@pytest.mark.parametrize(
    ("num_ctx", "num_batch", "num_gpu", "gpu_mib", "host_mib"),
    [
        (2048, 512, -1, 20.52, 77.42),
        (8192, 512, -1, 29.02, 77.42),
        (2048, 128, -1, 5.13, 76.48),
        (2048, 512, 10, 22.18, 77.42),
        (8192, 512, 10, 33.68, 77.42),
    ],
)
def test_gemma_on_lavapipe(gemma_gguf, num_ctx, num_batch, num_gpu, gpu_mib, host_mib):
    """Gemma 3 270M: its 170 MiB output matrix is past lavapipe's limit, so
    ggml-vulkan leaves the output (its weights and logits) to the CPU."""
    opts = EstimateOptions(num_ctx=num_ctx, num_batch=num_batch, gpu_max_tensor=LAVAPIPE)
    info = read_model_info(gemma_gguf)
    est = estimate(info, opts)
    host_mib += grown(info, num_batch)
    p = plan_layout(est, [gpu("a", 64 * GiB)], system_free=64 * GiB, num_gpu=num_gpu)
    on_gpu, cpu = p.allocations
    # the tied matrix once, on the CPU (with the output norm)
    assert est.output_weights - est.input_weights < MiB
    assert cpu.weights == est.output_weights + sum(est.layer_weights[: 19 - p.n_gpu_layers])
    tolerance = 0.20 if (num_ctx, num_gpu) == (8192, 10) else 0.10  # a split's peak: -15 %
    assert abs(on_gpu.graph / MiB - gpu_mib) <= tolerance * gpu_mib
    assert abs(cpu.graph / MiB - host_mib) <= 0.10 * host_mib
