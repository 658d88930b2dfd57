"""Scheduler policy, driven with fake runners and simulated devices (no processes)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from scheduler_env import (
    INFOS,
    ONE_GPU,
    Factory,
    GiB,
    MiB,
    entry,
    info,
    make,
    simulated,
    use,
)
from waiting import until

from jupyter_llm import scheduler as sched
from jupyter_llm.api.ps import describe_loaded
from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceSource
from jupyter_llm.request.errors import AllocationFailed, InsufficientMemory, ServerBusy
from jupyter_llm.request.identity import Requester
from jupyter_llm.scheduler import LoadOptions, Scheduler, choose_victim, vram


async def test_same_model_same_options_reuses():
    s, f = make(ONE_GPU)
    a = entry("a")
    first = await use(s, a)
    second = await use(s, a)
    assert first is second and len(f.specs) == 1


async def test_larger_num_ctx_reloads_smaller_reuses():
    s, f = make(ONE_GPU)
    a = entry("a")
    await use(s, a, num_ctx=2048)
    await use(s, a, num_ctx=1024)
    assert len(f.specs) == 1
    await use(s, a, num_ctx=8192)
    assert len(f.specs) == 2 and not f.runners[0].alive
    assert [m.wanted.num_ctx for m in s.loaded_models()] == [8192]


async def test_load_time_option_change_reloads():
    s, f = make(ONE_GPU)
    a = entry("a")
    await use(s, a)
    await use(s, a, num_batch=256)
    assert len(f.specs) == 2


async def test_two_that_fit_coexist():
    s, _f = make(ONE_GPU)
    await use(s, entry("a"))
    await use(s, entry("b"))
    assert sorted(m.key for m in s.loaded_models()) == ["a:latest", "b:latest"]
    assert all(m.placement.gpus == ["gpu0"] for m in s.loaded_models())


async def test_one_that_does_not_fit_evicts_the_idle_one():
    s, _f = make(simulated([("gpu0", 12 * GiB, False)]))
    await use(s, entry("a"))
    await use(s, entry("b"))
    assert [m.key for m in s.loaded_models()] == ["b:latest"]
    assert s.loaded_models()[0].placement.n_gpu_layers == 33  # full fit after eviction


async def test_busy_victim_is_drained_before_eviction():
    s, f = make(simulated([("gpu0", 12 * GiB, False)]))
    a, b = entry("a"), entry("b")
    lease = await s.acquire(a, LoadOptions(), None)
    load_b = asyncio.ensure_future(use(s, b))
    await until(lambda: lease.loaded.draining)  # b's load chose a and waits for it
    assert not load_b.done() and f.runners[0].alive  # waits for a's request to end
    lease.release()
    await asyncio.wait_for(load_b, 5)
    assert [m.key for m in s.loaded_models()] == ["b:latest"]


async def test_queue_full_is_503():
    s, _ = make(ONE_GPU, max_queue=1)
    a = entry("a")
    lease = await s.acquire(a, LoadOptions(), None)  # holds the only slot
    waiting = asyncio.ensure_future(s.acquire(a, LoadOptions(), None))  # queued for the slot
    await until(lambda: s.pending == 1)
    with pytest.raises(ServerBusy, match="maximum pending requests exceeded"):
        await s.acquire(a, LoadOptions(), None)
    lease.release()
    (await waiting).release()


async def test_one_user_cannot_fill_the_queue():
    s, _ = make(ONE_GPU, max_queue=4)
    a, ann, bob = entry("a"), Requester("ann"), Requester("bob")
    lease = await s.acquire(a, LoadOptions(), None, ann)  # holds the only slot
    queued = [asyncio.ensure_future(s.acquire(a, LoadOptions(), None, ann)) for _ in range(3)]
    await until(lambda: s.pending == 3)
    with pytest.raises(ServerBusy):  # the last quarter is kept for the others
        await s.acquire(a, LoadOptions(), None, ann)
    bobs = asyncio.ensure_future(s.acquire(a, LoadOptions(), None, bob))
    await until(lambda: s.pending == 4)
    lease.release()
    for granted in asyncio.as_completed([*queued, bobs]):  # bob's first: the least served
        (await granted).release()


async def test_num_parallel_slots_and_kv_size():
    s, f = make(ONE_GPU, num_parallel=2)
    a = entry("a")
    l1 = await s.acquire(a, LoadOptions(num_ctx=1024), None)
    l2 = await asyncio.wait_for(s.acquire(a, LoadOptions(num_ctx=1024), None), 1)
    assert l1.runner is l2.runner
    # one unified KV cache of num_ctx cells holds both sequences
    assert f.specs[0].n_ctx == 1024 and f.specs[0].n_seq == 2
    l1.release(), l2.release()


async def test_expiry_unloads_after_keep_alive():
    s, f = make(ONE_GPU)
    await use(s, entry("a"), keep_alive=0.05)
    assert s.loaded_models()
    await until(lambda: s.loaded_models() == [])
    assert not f.runners[0].alive


async def test_keep_alive_zero_unloads_right_after_request():
    s, _f = make(ONE_GPU)
    await use(s, entry("a"), keep_alive=0)
    await until(lambda: s.loaded_models() == [])


async def test_premature_expiry_while_busy_waits():
    s, f = make(ONE_GPU)
    lease = await s.acquire(entry("a"), LoadOptions(), 0.05)
    assert lease.loaded.timer is None  # busy: no expiry timer runs under a request
    await s._expire(lease.loaded)  # a timer that fired late changes nothing either
    assert s.loaded_models() and f.runners[0].alive
    lease.release()
    await until(lambda: s.loaded_models() == [])


async def test_request_without_keep_alive_keeps_current_value():
    s, _ = make(ONE_GPU)
    a = entry("a")
    await use(s, a, keep_alive=float("inf"))
    loaded = await use(s, a)
    assert loaded.keep_alive == float("inf") and loaded.expires_at is None


async def test_unload_all_on_shutdown():
    s, f = make(ONE_GPU)
    await use(s, entry("a"))
    await use(s, entry("b"))
    await s.shutdown()
    assert s.loaded_models() == [] and not any(r.alive for r in f.runners)


async def test_max_loaded_models_evicts_least_recently_used():
    s, _f = make(simulated([("gpu0", 80 * GiB, False)]), max_loaded_models=2)
    a, b, c = entry("a", info(50)), entry("b", info(50)), entry("c", info(50))
    await use(s, a)
    await use(s, b)
    await use(s, a)  # b is now the least recently used
    await use(s, c)
    assert sorted(m.key for m in s.loaded_models()) == ["a:latest", "c:latest"]


async def test_dead_runner_is_replaced():
    s, f = make(ONE_GPU)
    a = entry("a")
    await use(s, a)
    f.runners[0].kill()
    await use(s, a)
    assert len(f.specs) == 2 and s.loaded_models()[0].runner is f.runners[1]


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ([("a", 0, 300, 1), ("b", 0, 60, 2)], "b"),  # shortest keep_alive
        ([("a", 0, 300, 1), ("b", 0, 300, 2)], "a"),  # then least recently used
        ([("a", 1, 5, 1), ("b", 0, 300, 2)], "b"),  # idle before busy
        ([("a", 1, 300, 1), ("b", 2, 60, 2)], "b"),  # none idle: best busy one
        ([("a", 0, float("inf"), 1), ("b", 0, 300, 2)], "b"),  # forever goes last
    ],
)
def test_choose_victim(models, expected):
    loaded = [
        sched.Loaded(
            entry=entry(n),
            runner=None,
            wanted=None,
            placement=None,
            allocations=(),
            measured=False,
            keep_alive=k,
            refcount=r,
            last_used=used,
        )
        for n, r, k, used in models
    ]
    assert choose_victim(loaded).key == f"{expected}:latest"


# -- the seed behaviours at the policy level ------------------------------------------
async def test_seed1_discrete_gpu_before_integrated_with_more_free_memory():
    s, _ = make(simulated([("igpu", 64 * GiB, True), ("dgpu", 12 * GiB, False)]))
    loaded = await use(s, entry("a"))
    assert loaded.placement.gpus == ["dgpu"]


async def test_seed2_cpu_oom_evicts_others_then_fails_clearly():
    s, f = make(simulated([], system=10 * GiB))
    await use(s, entry("a"))  # ~7 GiB on the CPU
    await use(s, entry("b"))  # does not fit beside a: a is evicted
    assert [m.key for m in s.loaded_models()] == ["b:latest"]
    with pytest.raises(
        InsufficientMemory, match=r"model requires more system memory \(.*\) than is available"
    ):
        await use(s, entry("big", info(400)))  # alone it still does not fit
    # nothing was started for it, b had to go, and the scheduler keeps working
    assert len(f.specs) == 2
    assert (await use(s, entry("c"))).key == "c:latest"


async def test_seed3_forced_num_gpu_evicts_others_then_loads_with_n_layers():
    s, _f = make(simulated([("gpu0", 12 * GiB, False)]))
    await use(s, entry("a"))
    loaded = await use(s, entry("b"), num_gpu=30)
    assert [m.key for m in s.loaded_models()] == ["b:latest"]
    assert loaded.placement.n_gpu_layers == 30
    await s.shutdown()


async def test_seed3_forced_num_gpu_that_cannot_be_allocated_alone():
    s, f = make(simulated([("gpu0", 4 * GiB, False)]))
    with pytest.raises(
        InsufficientMemory, match="memory layout cannot be allocated with num_gpu = 30"
    ):
        await use(s, entry("a"), num_gpu=30)
    assert f.specs == []


CUDA_GPUS = [
    {
        "index": 0,
        "name": "CUDA0",
        "description": "RTX",
        "type": "gpu",
        "library": "CUDA",
        "free_memory": 12 * GiB,
        "total_memory": 12 * GiB,
        "pci_id": "0000:01:00.0",
    },
    {
        "index": 1,
        "name": "CUDA1",
        "description": "RTX",
        "type": "gpu",
        "library": "CUDA",
        "free_memory": 4 * GiB,
        "total_memory": 4 * GiB,
        "pci_id": "0000:02:00.0",
    },
]


def real(factory: Factory, **settings) -> tuple[Scheduler, list[int]]:
    from jupyter_llm.devices import device_from_raw

    calls = [0]

    async def discover():
        calls[0] += 1
        return [device_from_raw(d) for d in CUDA_GPUS]

    s = Settings.from_env({}, **settings)
    devices = DeviceSource(discover, environ={})
    return Scheduler(s, factory, devices, read_info=lambda p: INFOS[str(p)]), calls


async def test_placement_becomes_load_parameters():
    f = Factory(gpus=CUDA_GPUS)
    s, _ = real(f)
    await use(s, entry("big", info(400)))  # 13+ GiB: both GPUs
    spec = f.specs[0]
    assert spec.n_gpu_layers == 33
    assert dict(spec.env) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert len(spec.tensor_split) == 2 and sum(spec.tensor_split) == 33


async def test_seed4_new_estimates_backoff_then_measured_figures():
    measured = {
        "CUDA0": {"weights": 5 * GiB, "kv_cache": GiB, "graph": 100 * MiB},
        "cpu": {"weights": 250 * MiB, "kv_cache": 0, "graph": 0},
    }
    f = Factory(gpus=CUDA_GPUS, fail=2, measured=measured)
    s, _ = real(f, new_estimates=True)
    loaded = await use(s, entry("a", info(200)))
    layers = [spec.n_gpu_layers for spec in f.specs]
    assert len(layers) == 3 and layers[0] >= layers[1] >= layers[2]
    assert loaded.measured
    gpu = next(a for a in loaded.allocations if a.device != "cpu")
    assert (gpu.weights, gpu.kv_cache, gpu.graph) == (5 * GiB, GiB, 100 * MiB)
    ps = describe_loaded(loaded)
    assert ps["size_vram"] == 5 * GiB + GiB + 100 * MiB
    assert all(a["measured"] for a in ps["allocations"])


async def test_seed4_backoff_gives_up_with_clear_error():
    f = Factory(gpus=CUDA_GPUS, fail=100)
    s, _ = real(f, new_estimates=True)
    with pytest.raises(InsufficientMemory, match="memory layout cannot be allocated"):
        await use(s, entry("a"))
    assert s.loaded_models() == []


async def test_without_new_estimates_allocation_failure_is_reported_once():
    f = Factory(gpus=CUDA_GPUS, fail=1)
    s, _ = real(f)
    with pytest.raises(AllocationFailed, match="could not allocate"):
        await use(s, entry("a"))
    assert len(f.specs) == 1


async def test_seed5_free_memory_refresh_asks_loaded_runner_first():
    f = Factory(gpus=CUDA_GPUS)
    s, discoveries = real(f, max_loaded_models=5)
    await use(s, entry("a", info(20)))
    assert discoveries[0] == 1
    await use(s, entry("b", info(20)))
    assert discoveries[0] == 1 and f.runners[0].info_calls > 0


def count_device_reads(monkeypatch, s: Scheduler) -> list[int]:
    reads = [0]
    current = s.current_devices

    async def counted():
        reads[0] += 1
        return await current()

    monkeypatch.setattr(s, "current_devices", counted)
    return reads


async def test_vram_recovery_wait_after_gpu_unload(monkeypatch):
    monkeypatch.setattr(vram, "VRAM_RECOVERY_TIMEOUT", 0.3)
    monkeypatch.setattr(vram, "VRAM_RECOVERY_POLL", 0.05)
    f = Factory(gpus=CUDA_GPUS)  # free memory never recovers in this fake
    s, _ = real(f)
    await use(s, entry("a"))
    reads = count_device_reads(monkeypatch, s)
    assert await s.unload("a:latest")
    assert reads[0] >= 3  # before, after, and polled again while waiting


async def test_no_vram_wait_for_a_runner_found_dead(monkeypatch):
    """Its VRAM may be back already: there is no baseline to wait against."""
    monkeypatch.setattr(vram, "VRAM_RECOVERY_TIMEOUT", 3600.0)  # a wait would be the timeout
    f = Factory(gpus=CUDA_GPUS)
    s, _ = real(f)
    await use(s, entry("a"))
    f.runners[0].kill()
    reads = count_device_reads(monkeypatch, s)
    await asyncio.wait_for(use(s, entry("a")), 60)  # the dead one unloads, a new one loads
    assert len(f.runners) == 2 and f.runners[1].alive
    assert reads[0] >= 1  # the new placement read the devices; the unload waited on none


async def test_no_vram_wait_at_shutdown(monkeypatch):
    monkeypatch.setattr(vram, "VRAM_RECOVERY_TIMEOUT", 3600.0)
    f = Factory(gpus=CUDA_GPUS)
    s, _ = real(f)
    await use(s, entry("a"))
    s._closing = True  # what shutdown sets before its runners stop
    reads = count_device_reads(monkeypatch, s)
    assert await asyncio.wait_for(s.unload("a:latest"), 60)
    assert reads[0] == 0


async def test_no_vram_wait_for_cpu_only_runner(monkeypatch):
    f = Factory(gpus=CUDA_GPUS)
    s, _ = real(f)
    await use(s, entry("a"), num_gpu=0)
    reads = count_device_reads(monkeypatch, s)
    await s.unload("a:latest")
    assert reads[0] == 0  # nothing held on a GPU: no recovery to wait for


async def test_ps_reports_allocations_per_device():
    s, _ = make(simulated([("gpu0", 4 * GiB, False)]))
    loaded = await use(s, entry("a"))  # partial offload: GPU and CPU
    ps = describe_loaded(loaded)
    devices = [a["device"] for a in ps["allocations"]]
    assert devices == ["gpu0", "cpu"]
    assert 0 < ps["size_vram"] < ps["size"]
    assert not any(a["measured"] for a in ps["allocations"])
    assert ps["context_length"] == 4096


async def test_seed4_backoff_shrinks_the_layout():
    f = Factory(gpus=CUDA_GPUS, fail=4)
    s, _ = real(f, new_estimates=True)
    await use(s, entry("a", info(380)))  # needs both GPUs at full free memory
    layers = [spec.n_gpu_layers for spec in f.specs]
    assert len(layers) == 5 and layers[-1] < layers[0]
    assert all(b <= a for a, b in itertools.pairwise(layers))


# -- a busy model never holds the others hostage --------------------------------------
async def test_waiting_for_a_drain_blocks_no_other_model():
    # 14 GiB: a (7.5 GiB with its KV cache) and two small ones (1.6 GiB each) fit
    # together; b (7.5 GiB) does not fit beside a
    s, f = make(simulated([("gpu0", 14 * GiB, False)]), max_loaded_models=4, num_parallel=2)
    a, b, c, d = entry("a"), entry("b"), entry("c", info(10)), entry("d", info(10))
    lease_a = await s.acquire(a, LoadOptions(), 1.0)  # the shortest keep_alive: b's victim
    lease_c = await s.acquire(c, LoadOptions(), None)  # busy too, so it is not evicted first
    load_b = asyncio.ensure_future(use(s, b))
    await until(lambda: lease_a.loaded.draining)  # b's load waits for a's request to end
    # meanwhile: a request for loaded c, a cheap load of d that evicts nothing and
    # expires at once, and an unload of c all complete
    await asyncio.wait_for(use(s, c), 10)
    assert (await asyncio.wait_for(use(s, d, keep_alive=0), 10)).key == "d:latest"
    await until(lambda: "d:latest" not in {m.key for m in s.loaded_models()})
    assert len(f.runners) == 3  # d evicted nothing
    lease_c.release()
    assert await asyncio.wait_for(s.unload("c:latest"), 10)
    assert [m.key for m in s.loaded_models()] == ["a:latest"] and not load_b.done()
    lease_a.release()
    assert (await asyncio.wait_for(load_b, 10)).key == "b:latest"
    assert [m.key for m in s.loaded_models()] == ["b:latest"]
    assert sum(r.alive for r in f.runners) == 1


async def test_a_draining_model_takes_no_new_requests():
    s, _f = make(simulated([("gpu0", 12 * GiB, False)]), num_parallel=2)
    a, b = entry("a"), entry("b")
    lease = await s.acquire(a, LoadOptions(), None)
    load_b = asyncio.ensure_future(use(s, b))
    await until(lambda: lease.loaded.draining)
    again = asyncio.ensure_future(use(s, a))  # a has a free slot, but it is being drained
    await until(lambda: s.pending == 2)  # it waits rather than keep the drain going
    assert lease.loaded.refcount == 1
    lease.release()
    assert (await asyncio.wait_for(load_b, 10)).key == "b:latest"
    reloaded = await asyncio.wait_for(again, 10)  # then a comes back
    assert reloaded.key == "a:latest" and reloaded.runner is not lease.runner


async def test_a_load_that_stops_waiting_unmarks_its_victim():
    s, _f = make(simulated([("gpu0", 12 * GiB, False)]), num_parallel=2)
    a, b = entry("a"), entry("b")
    lease = await s.acquire(a, LoadOptions(), None)
    load_b = asyncio.ensure_future(use(s, b))
    await until(lambda: lease.loaded.draining)
    load_b.cancel()  # the client of b left
    with pytest.raises(asyncio.CancelledError):
        await load_b
    assert not lease.loaded.draining
    second = await asyncio.wait_for(s.acquire(a, LoadOptions(), None), 10)
    assert second.runner is lease.runner  # a serves again from its free slot
    lease.release(), second.release()


async def test_reload_of_a_busy_model_waits_without_the_lock():
    s, f = make(ONE_GPU)
    a, c = entry("a"), entry("c", info(10))
    await use(s, c)
    lease = await s.acquire(a, LoadOptions(num_ctx=2048), None)
    bigger = asyncio.ensure_future(use(s, a, num_ctx=8192))
    await until(lambda: lease.loaded.draining)
    assert await asyncio.wait_for(s.unload("c:latest"), 10)  # not stuck behind the reload
    lease.release()
    reloaded = await asyncio.wait_for(bigger, 10)
    assert reloaded.wanted.num_ctx == 8192 and not lease.runner.alive
    assert [m.key for m in s.loaded_models()] == ["a:latest"] and len(f.specs) == 3


@pytest.mark.parametrize("new_estimates", [False, True])
async def test_what_a_runner_made_after_its_load_is_counted_at_a_requests_end(new_estimates):
    """An embedding context (made on the first embed) or prompts kept in RAM
    come after the load's figures: the runner says what it holds at a
    request's end, and the model's allocations (``/api/ps``, and what
    evicting it frees) count it, over the estimate or the measured load."""
    measured = {
        "CUDA0": {"weights": 5 * GiB, "kv_cache": GiB, "graph": 100 * MiB},
        "cpu": {"weights": 250 * MiB, "kv_cache": 0, "graph": 0},
    }
    f = Factory(gpus=CUDA_GPUS, measured=measured)
    s, _ = real(f, new_estimates=new_estimates)
    loaded = await use(s, entry("a", info(200)))
    before = {a.device: a for a in loaded.allocations}
    runner = loaded.runner
    runner.measured = {  # what its next request's end said
        "CUDA0": {"weights": 5 * GiB, "kv_cache": GiB + 9 * MiB, "graph": 165 * MiB},
        "cpu": {"weights": 250 * MiB, "kv_cache": 64 * MiB, "graph": 0},
    }
    assert await use(s, entry("a", info(200))) is loaded
    after = {a.device: a for a in loaded.allocations}
    gpu = next(d for d in after if d != "cpu")
    assert after[gpu].kv_cache - before[gpu].kv_cache == 9 * MiB
    assert after[gpu].graph - before[gpu].graph == 65 * MiB
    assert after["cpu"].kv_cache - before["cpu"].kv_cache == 64 * MiB
    assert describe_loaded(loaded)["size"] - sum(a.total for a in before.values()) == 138 * MiB
