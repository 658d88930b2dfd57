"""A draft model offloaded whole, as the runner loads one beside a target with
layers on a GPU: llama.cpp's Vulkan allocation on lavapipe (Vulkan0 and the
host) against the estimate's draft term (memory.draft). Skipped as the other
Vulkan tests are without the Vulkan runner environment."""

from __future__ import annotations

import pytest
import test_lavapipe
from cores import cores
from fakes import synthetic_model
from test_lavapipe import ROOT, VULKAN_PYTHON

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory import EstimateOptions, estimate
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

# the Vulkan tests' fixtures: the lavapipe device (or a skip), one shader cache
lavapipe, shader_cache = test_lavapipe.lavapipe, test_lavapipe.shader_cache
pytestmark = pytest.mark.timeout(600)  # lavapipe compiles its pipelines the first time
MiB = 1 << 20
# the small model's shapes in test_lavapipe, so lavapipe reuses its pipelines
SPEC = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8, context_length=8192)


@pytest.mark.parametrize(("num_ctx", "n_seq"), [(4096, 4), (8192, 1)])
async def test_an_offloaded_draft_is_the_estimate_per_device(
    tmp_path,
    monkeypatch,
    lavapipe,
    shader_cache,
    num_ctx,
    n_seq,
):
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("MESA_SHADER_CACHE_DIR", str(shader_cache))
    path = write_demo_model(tmp_path / "draft.gguf", SPEC)
    opts = EstimateOptions(num_ctx=num_ctx, num_parallel=n_seq)
    d = estimate(synthetic_model(), opts, draft=read_model_info(path)).draft
    spec = LoadSpec(
        path=str(path), n_ctx=num_ctx, n_seq=n_seq, n_batch=512, n_threads=cores(), n_gpu_layers=999
    )
    runner = await start_runner_with(spec, python=str(VULKAN_PYTHON), load_timeout=600)
    try:
        gpu, host = runner.measured["Vulkan0"], runner.measured["cpu"]
    finally:
        await runner.close()
    for measured, estimated in (
        (gpu["weights"], d.gpu_weights),
        (gpu["kv_cache"], d.kv),
        (gpu["graph"], d.gpu_graph),
        (host["weights"], d.host_weights),
        (host["graph"], d.host_graph),
    ):
        # llama.cpp prints each buffer in MiB with 2 decimals
        assert abs(measured - estimated) <= 0.02 * estimated + MiB // 100, (gpu, host, d)
    assert host["kv_cache"] == 0
