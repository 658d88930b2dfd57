"""The real Gemma 3 270M (tied embeddings, sliding-window layers, a 262k
vocabulary): the estimate against what llama.cpp allocates, and prefix reuse
with a windowed KV cache."""

from __future__ import annotations

import pytest
from cores import cores
from test_batching import ENDLESS, Run, drain

from jupyter_llm.memory import EstimateOptions, estimate, plan_layout
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

KINDS = ("weights", "kv_cache", "graph")


@pytest.mark.parametrize("num_ctx", [2048, 8192, 32768])
async def test_estimate_matches_allocations(gemma_gguf, num_ctx):
    est = estimate(read_model_info(gemma_gguf), EstimateOptions(num_ctx=num_ctx, num_parallel=4))
    cpu = plan_layout(est, [], system_free=1 << 50).allocations[-1]
    runner = await start_runner_with(
        LoadSpec(path=str(gemma_gguf), n_ctx=num_ctx, n_threads=cores(), n_seq=4), load_timeout=120
    )
    try:
        measured = {kind: sum(d.get(kind, 0) for d in runner.measured.values()) for kind in KINDS}
    finally:
        await runner.close()
    estimated = {"weights": cpu.weights, "kv_cache": cpu.kv_cache, "graph": cpu.graph}
    for kind in KINDS:
        assert measured[kind] > 0
        assert abs(estimated[kind] - measured[kind]) <= 0.10 * measured[kind], kind
    assert abs(cpu.total - sum(measured.values())) <= 0.10 * sum(measured.values())


@pytest.fixture(scope="module")
def gemma(gemma_gguf):
    # 2048 cells, one sequence: the windowed layers keep 512 + 512 cells
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=2048, n_threads=cores(), n_seq=1))
    assert engine.model.n_swa == 512
    yield engine
    engine.close()


LONG = " ".join(f"item {i} is {i * 7 % 13}." for i in range(220))  # past the window


def test_a_second_turn_reuses_the_first(gemma):
    first = Run(gemma, LONG, num_predict=4)
    drain(gemma)
    assert first.done.prompt_eval_count > 1024  # longer than the windowed cache
    second = Run(gemma, LONG + first.output + " And item 3?", num_predict=4)
    seq = gemma.slots[0].seq  # assigned on submit, its cached prefix kept
    assert seq is not None and seq.job is second.job
    assert seq.fed >= first.done.prompt_eval_count  # only the new tokens are decoded
    drain(gemma)
    assert second.done.eval_count == 4


def test_a_prompt_diverging_inside_the_cache_answers_as_a_fresh_runner(gemma, gemma_gguf):
    Run(gemma, LONG, num_predict=4)
    drain(gemma)
    diverged = LONG[: len(LONG) // 3] + " Forget that. Count to five:"
    reused = Run(gemma, diverged, num_predict=16)
    # the window the kept prefix needs was overwritten: decoded again from the start
    assert gemma.slots[0].seq.fed == 0
    drain(gemma)
    fresh_engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=2048, n_threads=cores(), n_seq=1))
    try:
        fresh = Run(fresh_engine, diverged, num_predict=16)
        drain(fresh_engine)
    finally:
        fresh_engine.close()
    assert reused.output == fresh.output and reused.done.eval_count == 16


def test_generation_runs_past_the_context(gemma_gguf):
    small = Engine(LoadParams(path=str(gemma_gguf), n_ctx=128, n_batch=64, n_threads=cores()))
    try:
        past = small.n_ctx + 24  # a shift: the window slides past n_ctx
        long = Run(small, "go", grammar=ENDLESS, num_predict=past)
        drain(small)
        assert (long.done.done_reason, long.done.eval_count) == ("length", past)
    finally:
        small.close()
