"""``Scheduler.plan`` against the load that follows it, on fake runners and
simulated GPUs: the plan's layout, options and evictions are the load's, and
planning changes nothing."""

from __future__ import annotations

import pytest
from scheduler_env import ONE_GPU, GiB, entry, info, make, simulated, use

from jupyter_llm.request.errors import InsufficientMemory
from jupyter_llm.scheduler import LoadOptions
from jupyter_llm.scheduler.fit import LoadPlan

TWELVE = simulated([("gpu0", 12 * GiB, False)])  # one default model, not two


async def plan(s, e, **options) -> LoadPlan:
    before = [(m.key, m.runner.pid) for m in s.loaded_models()]
    planned = await s.plan(e, LoadOptions(**options))
    assert [(m.key, m.runner.pid) for m in s.loaded_models()] == before  # nothing changed
    return planned


async def assert_load_follows(s, e, planned: LoadPlan, **options) -> None:
    evicted = {m.key for m in planned.evicts}
    kept = {m.key for m in s.loaded_models()} - evicted
    loaded = await use(s, e, **options)
    assert planned.fits and planned.placement == loaded.placement
    assert planned.allocations == loaded.allocations
    assert (planned.wanted, planned.node) == (loaded.wanted, loaded.node)
    assert {m.key for m in s.loaded_models()} == kept | {loaded.key}


async def test_nothing_loaded_nothing_evicted():
    s, f = make(ONE_GPU)
    planned = await plan(s, entry("a"), num_ctx=2048)
    assert planned.evicts == () and not planned.loaded and f.runners == []
    assert planned.wanted.num_ctx == 2048 and planned.placement.gpus == ["gpu0"]
    await assert_load_follows(s, entry("a"), planned, num_ctx=2048)


async def test_the_model_count_limit_evicts_the_least_recently_used():
    s, _f = make(ONE_GPU, max_loaded_models=2)
    await use(s, entry("a"))
    await use(s, entry("b"))
    planned = await plan(s, entry("c"))
    assert [m.key for m in planned.evicts] == ["a:latest"]
    await assert_load_follows(s, entry("c"), planned)


async def test_evictions_in_the_order_the_load_makes_them():
    s, _f = make(ONE_GPU)
    await use(s, entry("a"))
    await use(s, entry("b"))
    big = entry("big", info(layer_mib=560))  # 17.5 GiB of blocks: alone on the GPU
    planned = await plan(s, big)
    assert [m.key for m in planned.evicts] == ["a:latest", "b:latest"]
    await assert_load_follows(s, big, planned)


async def test_a_busy_model_is_evicted_after_its_requests():
    s, _f = make(TWELVE)
    lease = await s.acquire(entry("a"), LoadOptions(), None)
    planned = await plan(s, entry("b"))
    (victim,) = planned.evicts
    assert victim.key == "a:latest" and victim.refcount == 1
    lease.release()
    await assert_load_follows(s, entry("b"), planned)


async def test_a_loaded_model_is_reused_or_replaced():
    s, _f = make(ONE_GPU)
    loaded = await use(s, entry("a"), num_ctx=4096)
    same = await plan(s, entry("a"), num_ctx=2048)  # a smaller context: reused
    assert same.loaded and same.evicts == () and same.placement == loaded.placement
    assert same.wanted == loaded.wanted  # the runner's own context, 4096
    larger = await plan(s, entry("a"), num_ctx=8192)
    assert not larger.loaded and [m.key for m in larger.evicts] == ["a:latest"]
    await assert_load_follows(s, entry("a"), larger, num_ctx=8192)


async def test_no_layout_says_why_after_the_evictions_the_load_makes():
    s, _f = make(TWELVE)
    await use(s, entry("a"))
    huge = entry("huge", info(layer_mib=1000))
    planned = await plan(s, huge, num_gpu=33)
    reason = "memory layout cannot be allocated with num_gpu = 33"
    assert not planned.fits and planned.reason == reason and planned.allocations == ()
    assert [m.key for m in planned.evicts] == ["a:latest"]  # the load unloads it first
    with pytest.raises(InsufficientMemory, match=reason):
        await use(s, huge, num_gpu=33)
    assert s.loaded_models() == []
