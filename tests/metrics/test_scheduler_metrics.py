"""The scheduler's counters (loads, evictions, out-of-memory backoffs) and
its scrape-time gauges, on fake runners and a simulated GPU (an allocation
failure needs a GPU), read through prometheus_client's own registry."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY
from scheduler_env import ONE_GPU, Factory, entry, make, use
from waiting import until

from jupyter_llm.scheduler import LoadOptions


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_loads_evictions_and_backoffs_are_counted():
    s, _ = make(ONE_GPU, Factory(fail=2), max_loaded_models=1, new_estimates=True)
    names = ("metrics-a:latest", "metrics-b:latest")
    before = {
        (metric, n): value(f"jupyter_llm_{metric}_total", model=n)
        for metric in ("model_loads", "model_evictions", "oom_backoffs")
        for n in names
    }
    await use(s, entry("metrics-a"))  # two failed allocations, then a load
    await use(s, entry("metrics-b"))  # a evicted: one model at a time

    def grew(metric: str, n: str) -> float:
        return value(f"jupyter_llm_{metric}_total", model=n) - before[(metric, n)]

    assert grew("oom_backoffs", names[0]) == 2 and grew("oom_backoffs", names[1]) == 0
    assert grew("model_loads", names[0]) == 1 and grew("model_loads", names[1]) == 1
    assert grew("model_evictions", names[0]) == 1 and grew("model_evictions", names[1]) == 0


async def test_gauges_follow_the_scheduler_at_each_scrape():
    s, _ = make(ONE_GPU, num_parallel=1)
    e, name = entry("metrics-q"), "metrics-q:latest"
    async with s.use(e, LoadOptions(), None) as lease:
        assert value("jupyter_llm_busy_slots", model=name) == 1
        assert value("jupyter_llm_slots", model=name) == 1
        runner_threads = lease.loaded.runner.threads
        runner_threads.loaded, runner_threads.now = 4, 4
        assert value("jupyter_llm_cpu_threads", model=name) == 4
        runner_threads.saw([{"type": "done", "threads": 1}])  # other work took cores
        assert value("jupyter_llm_cpu_threads", model=name) == 1
        memory = "jupyter_llm_model_memory_bytes"
        for a in lease.loaded.allocations:  # per device and kind, as the scheduler holds it
            for kind in ("weights", "kv_cache", "graph"):
                assert value(memory, model=name, device=a.device, kind=kind) == getattr(a, kind)
        assert value(memory, model=name, device="gpu0", kind="weights") > 0
        waiter = asyncio.ensure_future(use(s, e))  # waits for the one slot
        await until(lambda: value("jupyter_llm_queue_depth", model=name) == 1, 10, "a queued one")
    await waiter
    assert value("jupyter_llm_busy_slots", model=name) == 0
    assert value("jupyter_llm_queue_depth", model=name) == 0
