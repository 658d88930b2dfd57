"""A draft model's memory: its weights, its KV cache at the target's cells,
sequences and cache type, and its compute graph, on the target's first GPU
(its host part on the CPU) or on the CPU; against llama.cpp's own allocation
for a generated draft model on the CPU; and through the scheduler to the load
request, ``/api/ps``'s size and the plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cores import cores
from fakes import synthetic_model
from scheduler_env import GiB, MiB, entry, make, simulated, use

from jupyter_llm.api.ps import describe_loaded
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory import CPU, EstimateOptions, GpuSlot, estimate, plan_layout
from jupyter_llm.memory.draft import draft_memory
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with
from jupyter_llm.scheduler import LoadOptions

TARGET = synthetic_model(200, 32)  # 7B-like
DRAFT = synthetic_model(20, 8, n_embd=1024, n_head=16, n_head_kv=4, edge_mib=60)
OPTS = EstimateOptions(num_ctx=8192, num_parallel=4)
KINDS = ("weights", "kv_cache", "graph")


def _by_device(placement):
    return {a.device: a for a in placement.allocations}


def test_the_draft_is_its_own_estimate_at_the_targets_options():
    alone = estimate(DRAFT, replace(OPTS, draft_context=True))  # a row per sequence id
    d = estimate(TARGET, OPTS, draft=DRAFT).draft
    assert d == draft_memory(alone)
    assert d.kv == alone.kv_total and d.cpu_total == alone.cpu_only_total
    # on a GPU: blocks and output there, the token embeddings on the CPU
    assert d.gpu_weights == sum(alone.layer_weights) + alone.output_weights
    assert d.host_weights == alone.input_weights
    assert (d.gpu_graph, d.host_graph) == (alone.gpu_graph_full, alone.host_graph_full)
    assert estimate(TARGET, OPTS).draft is None


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_the_drafts_cache_follows_the_targets_cells_and_type(kv_type):
    small = estimate(TARGET, replace(OPTS, kv_type=kv_type), draft=DRAFT).draft
    big = estimate(TARGET, replace(OPTS, num_ctx=16384, kv_type=kv_type), draft=DRAFT).draft
    assert big.kv == 2 * small.kv
    f16 = estimate(TARGET, OPTS, draft=DRAFT).draft
    assert small.kv * 32 == f16.kv * (17 if kv_type == "q8_0" else 32)


def test_on_the_cpu_the_draft_adds_its_whole_estimate():
    plain = plan_layout(estimate(TARGET, OPTS), [], system_free=1 << 50).allocations[-1]
    est = estimate(TARGET, OPTS, draft=DRAFT)
    cpu = plan_layout(est, [], system_free=1 << 50).allocations[-1]
    d = est.draft
    assert (cpu.weights, cpu.kv_cache, cpu.graph) == (
        plain.weights + d.cpu_weights,
        plain.kv_cache + d.kv,
        plain.graph + d.cpu_graph,
    )
    assert est.cpu_only_total == estimate(TARGET, OPTS).cpu_only_total + d.cpu_total


def test_offloaded_the_draft_goes_to_the_first_gpu_its_host_part_to_the_cpu():
    gpus = [GpuSlot("g0", "CUDA", 40 * GiB), GpuSlot("g1", "CUDA", 40 * GiB)]
    plain = _by_device(plan_layout(estimate(TARGET, OPTS), gpus, 1 << 50))
    est = estimate(TARGET, OPTS, draft=DRAFT)
    placed = _by_device(plan_layout(est, gpus, 1 << 50))
    d = est.draft
    assert placed["g0"].total == plain["g0"].total + d.gpu_total
    assert placed["g0"].kv_cache == plain["g0"].kv_cache + d.kv
    assert placed[CPU].total == plain[CPU].total + d.host_total
    assert "g1" not in placed


def test_the_draft_counts_when_the_gpu_is_filled():
    # room for the target alone: with its draft, a layer less fits
    full = plan_layout(estimate(TARGET, OPTS), [GpuSlot("g0", "CUDA", 40 * GiB)], 1 << 50)
    room = full.allocations[0].total + 457 * MiB + 64 * MiB
    gpu = [GpuSlot("g0", "CUDA", room)]
    assert plan_layout(estimate(TARGET, OPTS), gpu, 1 << 50).n_gpu_layers == 33
    est = estimate(TARGET, OPTS, draft=DRAFT)
    partial = plan_layout(est, gpu, 1 << 50)
    assert partial.n_gpu_layers < 33
    assert partial.allocations[0].total <= room - 457 * MiB
    assert _by_device(partial)["g0"].kv_cache >= est.draft.kv  # the draft is still on the GPU


async def test_estimate_matches_llamas_allocation_for_a_draft(tmp_path):
    """llama.cpp's allocation for the draft GGUF in a context shaped as the
    target's (the runner's draft context), against the draft term."""
    path = write_demo_model(
        tmp_path / "draft.gguf",
        DemoModelSpec(n_embd=256, n_layer=4, n_ff=512, n_head=4, context_length=8192),
    )
    num_ctx, n_seq, num_batch = 4096, 4, 512
    opts = EstimateOptions(num_ctx=num_ctx, num_batch=num_batch, num_parallel=n_seq)
    d = estimate(TARGET, opts, draft=read_model_info(path)).draft
    spec = LoadSpec(
        path=str(path), n_ctx=num_ctx, n_seq=n_seq, n_batch=num_batch, n_threads=cores()
    )
    runner = await start_runner_with(spec, load_timeout=120)
    try:
        measured = {k: sum(s.get(k, 0) for s in runner.measured.values()) for k in KINDS}
    finally:
        await runner.close()
    estimated = {"weights": d.cpu_weights, "kv_cache": d.kv, "graph": d.cpu_graph}
    for kind in KINDS:
        assert measured[kind] > 0
        assert abs(estimated[kind] - measured[kind]) <= 0.10 * measured[kind], (kind, estimated)
    assert abs(d.cpu_total - sum(measured.values())) <= 0.10 * sum(measured.values())


async def test_a_draft_context_is_made_for_a_row_per_sequence(gemma_gguf):
    """A draft decodes at most a row per sequence id (memory.outputs.draft_rows),
    so its context keeps that many rows of logits, not the target's 68. Gemma
    3 270M drafting for itself: what the draft adds to the load's graph is the
    estimate's (with the target's rows it would be 60 MiB more: a 262k vocabulary)."""
    info = read_model_info(gemma_gguf)
    num_ctx, n_seq = 2048, 4
    est = estimate(info, EstimateOptions(num_ctx=num_ctx, num_parallel=n_seq), draft=info)
    assert est.draft is not None
    graphs = []
    for draft in ("", str(gemma_gguf)):
        spec = LoadSpec(
            path=str(gemma_gguf), draft=draft, n_ctx=num_ctx, n_seq=n_seq, n_threads=cores()
        )
        runner = await start_runner_with(spec, load_timeout=120)
        try:
            graphs.append(sum(s.get("graph", 0) for s in runner.measured.values()))
        finally:
            await runner.close()
    added = graphs[1] - graphs[0]
    assert abs(est.draft.cpu_graph - added) <= 0.10 * added, (est.draft.cpu_graph, added)


async def test_the_scheduler_loads_estimates_and_plans_with_the_draft():
    target, drafted = entry("big", TARGET), entry("small", DRAFT)
    with_draft = replace(
        target, name=replace(target.name, name="fast"), draft_path=drafted.model_path
    )
    scheduler, factory = make(simulated([("gpu0", 24 * GiB, False)]))
    try:
        plain_plan = await scheduler.plan(target, LoadOptions(num_ctx=8192))
        plan = await scheduler.plan(with_draft, LoadOptions(num_ctx=8192))
        w = plan.wanted
        opts = EstimateOptions(
            num_ctx=w.num_ctx,
            num_batch=w.num_batch,
            kv_type=w.kv_cache_type,
            num_parallel=scheduler.settings.num_parallel,
        )
        d = estimate(TARGET, opts, draft=DRAFT).draft
        assert plan.placement.total == plain_plan.placement.total + d.gpu_total + d.host_total
        loaded = await use(scheduler, with_draft, num_ctx=8192)
        assert factory.specs[-1].draft == str(drafted.model_path)
        assert describe_loaded(loaded)["size"] == plan.placement.total
        await use(scheduler, target, num_ctx=8192)
        assert factory.specs[-1].draft == ""
    finally:
        await scheduler.shutdown()
