"""The batch loop's context is made for the rows of logits a step can ask
for (``memory.outputs``), not a row per batch token, and a step never asks
for more: llama.cpp aborts the runner on a decode past ``n_outputs_max``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cores import cores
from engine_run import EngineRun as Run
from fakes import synthetic_model
from scheduler_env import ONE_GPU, entry, make

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory import EstimateOptions, estimate
from jupyter_llm.memory.outputs import draft_rows, output_growth, output_rows
from jupyter_llm.request.limits import DRAFT_TOKENS
from jupyter_llm.runner.engine import Engine, context_params
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.step_costs import StepCosts
from jupyter_llm.scheduler import LoadOptions


@pytest.mark.parametrize(
    ("n_batch", "n_seq", "n_seq_max", "rows"),
    [
        (512, 4, 8, 4 * (1 + DRAFT_TOKENS.value)),  # the defaults: 68, not 512
        (512, 1, 2, 1 + DRAFT_TOKENS.value),
        (32, 4, 8, 32),  # the batch holds fewer
        (4, 4, 8, 8),  # a row per sequence id, whatever the batch
        (512, 64, 128, 512),
    ],
)
def test_output_rows(n_batch, n_seq, n_seq_max, rows):
    assert output_rows(n_batch, n_seq, n_seq_max) == rows


def test_a_step_never_asks_for_more_rows_than_the_context_holds(tmp_path: Path):
    """Four sequences drafting 16 tokens each want 68 rows a step; with a
    context made for 10, their drafts are cut to the rows left, and every
    answer is still the undrafted one."""
    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=2048, n_seq=4, n_threads=cores()))
    try:
        assert engine.n_outputs == output_rows(engine.n_batch, 4, len(engine.slots)) == 68
        engine.step_costs = StepCosts(engine.n_seq, engine.n_batch, pinned=0.0)  # drafts are free
        prompts = [f"{w} hello world hello world hello world" for w in ("a", "b", "c", "d")]
        plain = {}
        for p in prompts:
            run = Run(engine, p, num_predict=48, draft_num_predict=0)
            while not run.ended:
                engine.step()
            plain[p] = run.output
        engine.n_outputs = 10
        rows: list[int] = []
        decode = engine._decode

        def counted(n, outputs, fed):
            rows.append(sum(engine.batch.logits[i] for i in range(n)))
            return decode(n, outputs, fed)

        engine._decode = counted
        runs = [Run(engine, p, num_predict=48, draft_num_predict=16) for p in prompts]
        while not all(r.ended for r in runs):
            engine.step()
        assert max(rows) == 10  # drafts ran, cut to the rows left
        assert {p: r.output for p, r in zip(prompts, runs, strict=True)} == plain
    finally:
        engine.close()


def test_the_logits_buffer_grows_to_a_steps_rows():
    """From a row per sequence id to the rows a step may ask for: 60 MiB on a
    262k vocabulary at the defaults (8 ids, 68 rows), none for a draft's."""
    assert output_growth(262144, 68, 8) == 60 << 20
    assert output_growth(262144, draft_rows(8), 8) == 0


async def test_the_plan_counts_the_rows_of_the_runners_slots():
    """The scheduler's estimate has the runner's slot count (num_parallel), so
    the rows of logits it counts are the runner's, not a fixed 4 slots'."""
    model = replace(synthetic_model(), n_vocab=262144)
    graphs = []
    for num_parallel in (1, 4, 8):
        scheduler, _ = make(ONE_GPU, num_parallel=num_parallel)
        try:
            plan = await scheduler.plan(entry("big", model), LoadOptions(num_ctx=8192))
        finally:
            await scheduler.shutdown()
        assert plan.placement is not None
        est = estimate(model, EstimateOptions(num_ctx=8192, num_parallel=num_parallel))
        graph = sum(a.graph for a in plan.placement.allocations)
        assert graph == est.gpu_graph_full + est.host_graph_full
        graphs.append(graph)
    assert graphs[0] < graphs[1] < graphs[2]


def test_more_slots_than_the_context_asked_for_still_fit_a_step(tmp_path: Path):
    """llama.cpp holds n_batch to the n_ctx asked for; 20 slots with num_ctx
    16 made a step of 20 tokens past a batch of 16, and llama.cpp aborted the
    runner (GGML_ASSERT). The context asks for a cell per slot at least."""
    cp = context_params(LoadParams(path="/m", n_ctx=16, n_seq=20), 2048)
    assert cp.n_ctx >= cp.n_batch >= 20
    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=16, n_seq=20, n_threads=cores()))
    try:
        runs = [Run(engine, f"hello {i}", num_predict=3) for i in range(20)]
        while not all(r.ended for r in runs):
            engine.step()
        assert [r.done.eval_count for r in runs if r.done] == [3] * 20
    finally:
        engine.close()
