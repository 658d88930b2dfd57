"""The batch_invariant setting: a token's logits do not depend on what else
its decode holds, so greedy output is the same with and without drafts and
beside other requests. The choice and its fallbacks, how it reaches the
estimate, the launch and /api/ps, and on the real model through a runner."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import llama_cpp
import pytest
from cores import cores
from engine_run import EngineRun as Run
from engine_run import finish
from fakes import FakeRunnerFactory, synthetic_model
from kv_buffers import LOG_PRECISION, estimated_kv, measured_kv
from rewrite_prompt import QUOTE_PROMPT, REWRITE_PROMPT
from scheduler_env import ONE_GPU, entry, make, use

from jupyter_llm.api.ps import describe_loaded
from jupyter_llm.config import Settings
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.devices import DeviceInfo
from jupyter_llm.memory import EstimateOptions, Placement, estimate, plan_layout
from jupyter_llm.memory.kv_cache import (
    CacheChoice,
    asked_cache,
    choose_batch_invariant,
    key_type,
)
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.runner.engine import FLASH_ATTN_TYPES, Engine, context_params
from jupyter_llm.runner.kv_cache import cache_types
from jupyter_llm.runner.model import cpu_has_amx, model_params
from jupyter_llm.runner.protocol import Complete, LoadParams
from jupyter_llm.runner_client.launch import (
    INVARIANT_ENV,
    LoadRequest,
    LoadSpec,
    PromptDisk,
    launch_spec,
    prompt_disk_spec,
)
from jupyter_llm.runner_client.proxy import RunnerProxy, start_runner_with
from jupyter_llm.scheduler import LoadOptions, policy
from jupyter_llm.scheduler.fit import estimate_on
from jupyter_llm.scheduler.types import Wanted

FREE_PROMPT = (
    "<start_of_turn>user\nWrite a short story about a fox who learns to play the violin."
    "<end_of_turn>\n<start_of_turn>model\n"
)
LLAMA = synthetic_model(n_embd=4096, n_head=32)  # heads 128 wide
F16, Q8 = CacheChoice("f16"), CacheChoice("q8_0")


@pytest.mark.parametrize(
    ("requested", "cache", "flash", "model", "invariant", "reason"),
    [
        (False, F16, "auto", LLAMA, False, ""),
        (True, F16, "auto", LLAMA, True, ""),
        (True, Q8, "on", LLAMA, True, ""),
        (True, F16, "off", LLAMA, False, "needs flash attention, which is off"),
        (True, F16, "auto", replace(LLAMA, head_dim_k=80, head_dim_v=80), False, "of 32"),
        (True, F16, "auto", replace(LLAMA, head_dim_v=64), False, "no flash attention"),
        (True, F16, "auto", replace(LLAMA, architecture="gptoss"), False, "gptoss does not"),
        (True, Q8, "auto", replace(LLAMA, float_matrices=True), False, "f16/f32 weight"),
    ],
)
def test_whether_a_load_can_be_batch_invariant(requested, cache, flash, model, invariant, reason):
    got, why = choose_batch_invariant(requested, cache, flash, model)
    assert got is invariant
    assert (reason in why) if reason else why == ""


@pytest.mark.parametrize(
    ("kv_type", "invariant", "keys"),
    [("f16", False, "f16"), ("f16", True, "q8_0"), ("q8_0", True, "q8_0"), ("q4_0", True, "q4_0")],
)
def test_the_keys_type(kv_type, invariant, keys):
    assert key_type(kv_type, invariant) == keys


@pytest.mark.parametrize(
    ("kv_type", "invariant", "asked"),
    [
        ("f16", False, "f16"),
        ("f16", True, "q8_0 key"),
        ("q8_0", True, "q8_0"),
        ("q4_0", False, "q4_0"),
    ],
)
def test_the_cache_a_refusal_names(kv_type, invariant, asked):
    assert asked_cache(kv_type, invariant) == asked


def test_the_setting_takes_a_boolean():
    assert Settings.from_env({"JUPYTER_LLM_BATCH_INVARIANT": "on"}).batch_invariant is True
    assert Settings.from_env({}).batch_invariant is False
    with pytest.raises(ConfigError, match="JUPYTER_LLM_BATCH_INVARIANT: 'exact'; expected a bool"):
        Settings.from_env({"JUPYTER_LLM_BATCH_INVARIANT": "exact"})


def test_the_scheduler_estimates_and_launches_a_batch_invariant_load(caplog):
    settings = Settings.from_env({"JUPYTER_LLM_BATCH_INVARIANT": "1"})
    wanted = policy.wanted(LoadOptions(num_ctx=8192), LLAMA, settings)
    assert (wanted.kv_cache_type, wanted.batch_invariant) == ("f16", True)
    plain = policy.wanted(LoadOptions(num_ctx=8192), LLAMA, Settings.from_env({}))
    assert plain.batch_invariant is False
    mixed = estimate_on(LLAMA, wanted, [], None, parallel=4)
    full = estimate_on(LLAMA, plain, [], None, parallel=4)
    assert mixed.kv_total * 128 == full.kv_total * (34 + 64)  # q8_0 keys beside f16 values
    off = replace(settings, flash_attention="off")
    refused = policy.wanted(LoadOptions(), replace(LLAMA, architecture="llama-fa-off"), off)
    assert not refused.batch_invariant and "flash attention" in refused.batch_invariant_fallback
    assert "not batch-invariant: batch invariance needs flash attention" in caplog.text


def test_the_launch_turns_the_tiled_matmul_off_and_keys_the_prompt_cache():
    request = LoadRequest(
        path="/m/blobs/sha256-" + "a" * 64,
        num_ctx=4096,
        num_batch=512,
        num_thread=0,
        use_mmap=True,
        parallel=4,
        placement=plan_layout(estimate(LLAMA, EstimateOptions()), [], 1 << 50),
        batch_invariant=True,
    )
    spec = launch_spec(request, {})
    assert spec.batch_invariant and spec.env == INVARIANT_ENV
    assert spec.load_params.batch_invariant
    assert launch_spec(replace(request, batch_invariant=False), {}).env == ()
    assert launch_spec(replace(request, simulated=True), {}).env == INVARIANT_ENV
    gpu = DeviceInfo(id="GPU-0", library="CUDA", name="gpu", total_memory=24 << 30)
    layers = replace(request.placement, gpu_layers=(("GPU-0", 33),), n_gpu_layers=33)
    on_gpu = replace(request, gpus=(gpu,), placement=layers)
    env = dict(launch_spec(on_gpu, {}).env)
    assert env["GGML_CPU_TILED_MM"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "0"
    disk = PromptDisk("/cache", 1 << 30, 3600.0)
    assert "|q8_0-f16|" in prompt_disk_spec(request, disk)["model"]
    plain = prompt_disk_spec(replace(request, batch_invariant=False), disk)["model"]
    assert "|f16|" in plain  # another layout: states never cross between the two
    q8 = replace(request, kv_cache_type="q8_0")  # the same layout, written by other kernels
    keys = {prompt_disk_spec(replace(q8, batch_invariant=b), disk)["model"] for b in (True, False)}
    assert len(keys) == 2


WANTED = Wanted(num_ctx=4096, num_batch=512, num_thread=0, use_mmap=True, num_gpu=-1)
GPU_REASON = "layers on GPUs, whose kernels it does not cover"


@pytest.mark.parametrize(
    ("asked", "gpu_layers", "simulated", "invariant", "reason"),
    [
        (True, 0, False, True, ""),
        (True, 13, False, False, f"13 {GPU_REASON}"),
        (True, 13, True, True, ""),  # simulated GPUs: the runner computes on the CPU
        (False, 13, False, False, ""),
    ],
)
def test_where_a_load_is_placed_decides_what_ps_says(
    asked, gpu_layers, simulated, invariant, reason
):
    placement = Placement(gpu_layers=(), allocations=(), n_gpu_layers=gpu_layers, n_layers=33)
    wanted = replace(WANTED, batch_invariant=asked)
    placed = policy.invariant_where_placed(wanted, placement, simulated)
    assert (placed.batch_invariant, placed.batch_invariant_fallback) == (invariant, reason)


def test_the_runners_context_and_weights():
    """q8_0 keys beside f16 values, flash attention asked for (llama.cpp's
    auto would not turn it on for quantized keys alone), no repacked weights;
    with flash attention off both stay f16 (the server never sends that)."""
    params = LoadParams(path="/m", batch_invariant=True)
    cp = context_params(params, 4096)
    assert (cp.type_k, cp.type_v) == (llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_F16)
    assert cp.flash_attn_type == FLASH_ATTN_TYPES["on"]
    plain = context_params(LoadParams(path="/m"), 4096)
    assert (plain.type_k, plain.flash_attn_type) == (
        llama_cpp.GGML_TYPE_F16,
        FLASH_ATTN_TYPES["auto"],
    )
    assert cache_types(replace(params, flash_attn="off")) == (llama_cpp.GGML_TYPE_F16,) * 2
    assert cache_types(replace(params, kv_cache_type="q4_0")) == (llama_cpp.GGML_TYPE_Q4_0,) * 2
    assert model_params(params, None)[0].use_extra_bufts is False
    assert model_params(LoadParams(path="/m"), None)[0].use_extra_bufts is not cpu_has_amx()


def test_float_weight_matrices_are_seen_in_the_gguf(tmp_path):
    assert read_model_info(write_demo_model(tmp_path / "f32.gguf")).float_matrices  # all f32


def test_gemma_has_no_float_weight_matrices(gemma_gguf: Path):
    assert not read_model_info(gemma_gguf).float_matrices  # its f32 tensors are norms


def test_the_draft_model_keeps_the_settings_keys(tmp_path):
    """A draft's logits never reach an answer: its context and its estimate
    keep the setting's types, so a draft whose heads cannot have q8_0 keys
    (16 wide) still loads beside a batch-invariant model."""
    target = write_demo_model(tmp_path / "t.gguf", DemoModelSpec(n_embd=128, n_head=4, n_head_kv=2))
    draft = write_demo_model(tmp_path / "d.gguf", DemoModelSpec())
    params = LoadParams(path=str(target), draft=str(draft), n_ctx=256, n_threads=cores())
    engine = Engine(replace(params, batch_invariant=True))
    try:
        assert engine.kv_fallback == "" and engine.drafter is not None
        run = Run(engine, "hello world hello world hello", num_predict=12)
        finish(engine, run)
        assert run.done.eval_count == 12
    finally:
        engine.close()
    opts = EstimateOptions(256, kv_type="f16", kv_type_k="q8_0")
    small = read_model_info(draft)
    est = estimate(read_model_info(target), opts, draft=small)
    plain = estimate(small, EstimateOptions(256, kv_type="f16"))
    assert est.draft is not None and est.draft.kv == plain.kv_total


async def test_ps_shows_the_load_batch_invariant():
    s, f = make(ONE_GPU, FakeRunnerFactory(), batch_invariant=True)
    loaded = await use(s, entry("exact", LLAMA))
    assert f.specs[0].batch_invariant and f.specs[0].env[: len(INVARIANT_ENV)] == INVARIANT_ENV
    shown = describe_loaded(loaded)
    assert (shown["batch_invariant"], shown["batch_invariant_fallback"]) == (True, "")


async def test_a_refused_key_cache_shows_in_ps_and_the_load_is_reused(caplog):
    refused = "llama.cpp refused a q8_0 key cache for this model"
    factory = FakeRunnerFactory(kv_cache_fallback=refused)
    s, f = make(ONE_GPU, factory, batch_invariant=True)
    model = entry("refused", LLAMA)
    loaded = await use(s, model)
    shown = describe_loaded(loaded)
    assert (shown["kv_cache_type"], shown["kv_cache_fallback"]) == ("f16", "")
    assert (shown["batch_invariant"], shown["batch_invariant_fallback"]) == (False, refused)
    assert await use(s, model) is loaded and len(f.runners) == 1


# -- real runners ----------------------------------------------------------------------------


async def test_the_estimate_is_llama_cpps_kv_buffer_with_q8_0_keys(tmp_path):
    wide_heads = DemoModelSpec(n_embd=128, n_head=4, n_head_kv=2)  # q8_0 blocks divide them
    wide = write_demo_model(tmp_path / "wide.gguf", wide_heads)
    spec = LoadSpec(path=str(wide), n_ctx=2048, n_threads=cores(), n_seq=4, batch_invariant=True)
    measured, fallback = await measured_kv(spec)
    assert fallback == ""
    assert abs(estimated_kv(wide, 2048, "f16", "q8_0") - measured) <= LOG_PRECISION
    assert measured < estimated_kv(wide, 2048, "f16", "f16") - LOG_PRECISION


async def test_the_runner_falls_back_to_f16_where_llama_cpp_refuses_q8_0_keys(tmp_path):
    """16-wide heads: llama.cpp refuses q8_0 keys (the server's rule would not
    have asked); the load goes on with f16 and says why."""
    narrow = write_demo_model(tmp_path / "narrow.gguf")
    spec = LoadSpec(path=str(narrow), n_ctx=2048, n_threads=cores(), batch_invariant=True)
    measured, fallback = await measured_kv(spec)
    assert fallback == "llama.cpp refused a q8_0 key cache for this model"
    assert abs(estimated_kv(narrow, 2048, "f16", "f16") - measured) <= LOG_PRECISION


async def answer(runner: RunnerProxy, prompt: str, draft: int, n: int = 96) -> dict:
    options = {"temperature": 0, "num_predict": n, "draft_num_predict": draft}
    request = Complete(prompt=prompt, options=options, with_context=True)
    replies = [m async for batch in runner.complete(request)
               for m in batch]  # fmt: skip
    assert replies[-1]["type"] == "done", replies[-1]
    return replies[-1]


async def test_gemma_greedy_output_is_identical_with_drafts_and_beside_another_request(
    gemma_gguf: Path,
):
    """On the real model (q4_K, q5_0, q6_K and q8_0 weights) past 256 cells,
    where with the defaults the answer with drafts leaves the one without
    (at token 21 on a 2-core EPYC: the repacked q4_K product of 4 rows and
    flash attention's split of one query differ in their last bits, which
    Gemma's 8-bit activations and 18 layers grow). Through a runner process
    as the server launches it (its environment turns the tiled matmul off),
    and once beside another request, both asking for drafts (they draft
    only once alone, ``test_beside_other_requests_drafts_wait_until_alone``)."""
    spec = LoadSpec(
        path=str(gemma_gguf), n_ctx=2048, n_seq=2, n_threads=cores(),
        batch_invariant=True, env=INVARIANT_ENV,
    )  # fmt: skip
    runner = await start_runner_with(spec, load_timeout=120)
    try:
        plain = await answer(runner, QUOTE_PROMPT, draft=0)
        assert len(plain["context"]) > 256 and plain["eval_count"] == 96
        spec_done = await answer(runner, QUOTE_PROMPT, draft=4)
        assert spec_done["context"] == plain["context"]
        assert spec_done["draft_accepted"] > 60, spec_done
        other = QUOTE_PROMPT.replace("word for word", "in reverse order, word for word")
        both = await asyncio.gather(
            answer(runner, QUOTE_PROMPT, draft=4), answer(runner, other, draft=4)
        )
        assert both[0]["context"] == plain["context"]
    finally:
        await runner.close()


# one of the suite's slowest tests (34 s on a pytest-xdist worker with answers
# of 120 and 200 tokens; the divergence it guards against came at tokens 16 and
# 32, so 64 and 128 keep it in view), against the 120 s default: room for a CI
# machine a few times slower
@pytest.mark.timeout(300)
async def test_beside_other_requests_drafts_wait_until_alone(gemma_gguf: Path):
    """Four greedy requests at once answer as without drafts. Drafted beside
    one another, a rejected draft's freed cells went to the others' next
    tokens, out of their positions' order, and llama.cpp's attention adds a
    request's cells in the cache's order: on a 2-core EPYC two of four
    answers left the undrafted ones (at tokens 16 and 32). So a
    batch-invariant runner drafts only for a request generating alone: here
    the longest, once the others have ended."""
    spec = LoadSpec(
        path=str(gemma_gguf), n_ctx=4096, n_seq=4, n_threads=cores(),
        batch_invariant=True, env=INVARIANT_ENV,
    )  # fmt: skip
    asked = [(REWRITE_PROMPT, 64), (QUOTE_PROMPT, 64), (FREE_PROMPT, 64), (REWRITE_PROMPT, 128)]

    async def at_once(draft: int) -> list[dict]:
        # a fresh runner each time: one whose cache held these prompts would
        # free their old answers' cells, and the new tokens would take them in
        # an order that depends on when each request arrived (README)
        runner = await start_runner_with(spec, load_timeout=120)
        try:
            return await asyncio.gather(*(answer(runner, p, draft, n) for p, n in asked))
        finally:
            await runner.close()

    plain, drafted = await at_once(0), await at_once(4)
    for without, with_drafts in zip(plain, drafted, strict=True):
        assert with_drafts["context"] == without["context"]
    assert [d.get("draft_tokens", 0) > 0 for d in drafted] == [False, False, False, True]
