"""An attacker sharing the server, against the usage table (``/api/usage``,
the origin headers) and the sidebar's history (``/api/history``, its
sampler). On a live server whose users are a Hub's (alice and bob are not
admins, root is), with the demo model:

- a user naming a new kernel in every request pushes out only their own
  rows (``usage_user_kernels``), never another user's;
- another user's kernel id, ``?user=``, HEAD and the error texts tell a
  non-admin nothing of another user's usage;
- requests that fail before a slot (models that do not exist, bad headers)
  add nothing to the table or the token tally;
- the table and the history filled to every bound: memory and the time an
  answer takes are measured (recorded, not asserted: no timed assertions),
  the answer's size is asserted;
- the sampler: a hung or failing utilization read and a runner that does
  not answer cost points, never the sampler, and a stopped sampler leaves
  no task behind."""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import threading
import time
from types import SimpleNamespace

import pytest
from harness import record
from held_memory import held_bytes
from hub_users import with_hub_users
from tornado.httpclient import HTTPClientError
from waiting import until

from jupyter_llm.api.usage import usage_body
from jupyter_llm.devices import DeviceInfo
from jupyter_llm.history import TOKENS
from jupyter_llm.history.ring import HistoryRing, Sample, history_body
from jupyter_llm.history.sampler import HistorySampler
from jupyter_llm.history.tokens import TokenTally
from jupyter_llm.request.limits import (
    HISTORY_DEVICES,
    HISTORY_MODELS,
    HISTORY_POINTS,
    HISTORY_SAMPLES,
    ORIGIN_CHARS,
    USAGE_CELLS,
    USAGE_KERNELS,
    USAGE_MODELS,
    USAGE_ROWS,
    USAGE_USER_KERNELS,
    USAGE_USERS,
)
from jupyter_llm.request.origin import Origin
from jupyter_llm.usage import Sample as UsageSample
from jupyter_llm.usage import UsageStore

ALICE_KERNEL = "3f1c2a9e-8b7d-4c6e-9a1b-2d3e4f5a6b7c"


@pytest.fixture
def jp_server_config(jp_server_config):
    return with_hub_users(jp_server_config)


def origin(kernel: str, cell: str = "c1", count: str = "1") -> dict[str, str]:
    return {"X-LLM-Kernel": kernel, "X-LLM-Cell": cell, "X-LLM-Execution-Count": count}


async def generate(jp_fetch, token: str, headers: dict[str, str], model: str = "tiny"):
    body = {"model": model, "prompt": "hi", "stream": False,
            "options": {"num_predict": 1, "temperature": 0}}  # fmt: skip
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body),
                       headers={"Authorization": f"token {token}", **headers})  # fmt: skip
    return json.loads(r.body)


async def usage(jp_fetch, token: str, method: str = "GET", **params):
    r = await jp_fetch("llm", "api", "usage", method=method, params=params,
                       headers={"Authorization": f"token {token}"})  # fmt: skip
    return r


async def refused(call) -> tuple[int, bytes]:
    with pytest.raises(HTTPClientError) as e:
        await call
    return e.value.code, e.value.response.body if e.value.response else b""


def store_of(serverapp) -> UsageStore:
    return serverapp.web_app.settings["jupyter_llm"].usage


# -- usage: one user cannot push out another's rows ------------------------------------------


async def test_new_kernel_ids_push_out_only_the_senders_rows(jp_fetch, jp_serverapp,
                                                             installed_model):  # fmt: skip
    await generate(jp_fetch, "alice-token", origin(ALICE_KERNEL, "victim-cell"))
    # more fresh kernel ids than the whole table holds, eight requests at a time
    fresh = USAGE_KERNELS.value + 8
    for start in range(0, fresh, 8):
        await asyncio.gather(*(
            generate(jp_fetch, "bob-token", origin(f"k-{i}"))
            for i in range(start, min(fresh, start + 8))
        ))  # fmt: skip
    _, kernels, _ = store_of(jp_serverapp).sizes()
    assert kernels == USAGE_USER_KERNELS.value + 1  # bob's newest 32, and alice's one
    alice = json.loads((await usage(jp_fetch, "alice-token", kernel=ALICE_KERNEL)).body)
    assert [(r["cell"], r["requests"]) for r in alice["cells"]] == [("victim-cell", 1)]
    bob = json.loads((await usage(jp_fetch, "bob-token")).body)
    assert {r["kernel"] for r in bob["cells"]} == {
        f"k-{i}" for i in range(fresh - USAGE_USER_KERNELS.value, fresh)
    }
    assert bob["users"][0]["requests"] == fresh  # a user's totals outlive their kernels


# -- usage: nothing about another user -------------------------------------------------------


async def test_another_users_kernel_id_neither_reads_nor_writes_their_rows(
    jp_fetch, installed_model
):
    await generate(jp_fetch, "alice-token", origin(ALICE_KERNEL, "a-cell"))
    # bob knows (or guesses) alice's kernel id: he reads nothing of hers ...
    seen = json.loads((await usage(jp_fetch, "bob-token", kernel=ALICE_KERNEL)).body)
    assert seen["cells"] == [] and seen["users"] == []
    # ... and what he sends under it is his own row, not added to hers
    await generate(jp_fetch, "bob-token", origin(ALICE_KERNEL, "a-cell"))
    hers = json.loads((await usage(jp_fetch, "alice-token", kernel=ALICE_KERNEL)).body)
    assert [(r["user"], r["requests"]) for r in hers["cells"]] == [("alice", 1)]
    his = json.loads((await usage(jp_fetch, "bob-token", kernel=ALICE_KERNEL)).body)
    assert [(r["user"], r["requests"]) for r in his["cells"]] == [("bob", 1)]


async def test_user_head_and_errors_do_not_tell_whether_a_user_exists(jp_fetch, installed_model):
    await generate(jp_fetch, "alice-token", origin(ALICE_KERNEL))
    answers = set()
    for method in ("GET", "HEAD"):
        for name in ("alice", "nobody", "root"):
            code, body = await refused(usage(jp_fetch, "bob-token", method, user=name))
            answers.add((method, code, body))
    # one answer per method whoever is asked for, a 403, and HEAD without a body
    assert answers == {
        ("GET", 403, b'{"error": "only an admin may read another user\'s usage"}'),
        ("HEAD", 403, b""),
    }
    r = await usage(jp_fetch, "bob-token", "HEAD")
    assert r.code == 200 and r.body == b""
    code, body = await refused(usage(jp_fetch, "bob-token", user="alice", kernel=ALICE_KERNEL))
    assert code == 403 and ALICE_KERNEL.encode() not in body


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        (origin("k" * (ORIGIN_CHARS.value + 1)), "origin_chars"),
        (origin("k", "c" * 60_000), "origin_chars"),  # under tornado's 64 KiB of headers
        (origin("k<script>"), "X-LLM-Kernel may hold only"),
        (origin("k", "c", "1" * 10), "X-LLM-Execution-Count"),
        (origin("k", "c", "\u00b2"), "X-LLM-Execution-Count"),  # "²": str.isdigit() says yes
        ({"X-LLM-Cell": "c" * (ORIGIN_CHARS.value + 1)}, "origin_chars"),  # no kernel
    ],
    ids=["kernel", "huge-cell", "markup", "count", "superscript-digit", "cell-alone"],
)
async def test_bad_origin_headers_are_a_400_and_add_no_row(
    jp_fetch, jp_serverapp, installed_model, headers, says
):
    before = store_of(jp_serverapp).sizes()
    code, body = await refused(generate(jp_fetch, "bob-token", headers))
    assert code == 400 and says in json.loads(body)["error"]
    assert len(body) < 500  # the value is not echoed
    assert store_of(jp_serverapp).sizes() == before


async def test_the_longest_plain_origin_is_kept_as_sent(jp_fetch, installed_model):
    kernel, cell = "k" * ORIGIN_CHARS.value, "c" * ORIGIN_CHARS.value
    await generate(jp_fetch, "bob-token", origin(kernel, cell, "999999999"))
    [row] = json.loads((await usage(jp_fetch, "bob-token", kernel=kernel)).body)["cells"]
    assert (row["kernel"], row["cell"], row["execution_count"]) == (kernel, cell, 999_999_999)


async def test_requests_that_fail_before_a_slot_count_nothing(
    jp_fetch, jp_serverapp, installed_model
):
    await generate(jp_fetch, "bob-token", origin("warm"))  # the model loaded
    before, tally = store_of(jp_serverapp).sizes(), TOKENS.totals()
    for i in range(50):  # fifty names of models that do not exist, each from a new kernel
        code, _ = await refused(generate(jp_fetch, "bob-token", origin(f"x{i}"), f"nope-{i}"))
        assert code == 404
    assert store_of(jp_serverapp).sizes() == before
    assert TOKENS.totals().keys() == tally.keys()
    rows = json.loads((await usage(jp_fetch, "bob-token")).body)
    assert {r["model"] for r in rows["users"] + rows["cells"]} == {"tiny:latest"}


# -- usage: the table at every bound ----------------------------------------------------------


def full_store() -> UsageStore:
    """Every bound reached: users, kernels, cells per kernel, models per cell
    and per user, with the longest plain names."""
    store = UsageStore()
    name = "m" * 40
    users = [f"user-{i:04d}".ljust(ORIGIN_CHARS.value, "u") for i in range(USAGE_USERS.value)]
    for u in users:
        for m in range(USAGE_MODELS.value):
            store.record(u, Origin("api"), UsageSample(f"{name}{m}", 1, 1, 0.1, 0.1, 1.0))
    owners = users[: USAGE_KERNELS.value // USAGE_USER_KERNELS.value]
    for k in range(USAGE_KERNELS.value):
        kernel = Origin(f"{k:04d}".ljust(ORIGIN_CHARS.value, "k"))
        for c in range(USAGE_CELLS.value):
            cell = Origin(kernel.kernel, f"{c:04d}".ljust(ORIGIN_CHARS.value, "c"), c)
            for m in range(USAGE_MODELS.value):
                sample = UsageSample(f"{name}{m}", 1, 1, 0.1, 0.1, 1.0)
                store.record(owners[k % len(owners)], cell, sample, now=k * 1000 + c)
    return store


def test_the_full_usage_table_and_its_largest_answer():
    store = full_store()
    held = held_bytes(store)  # what tracemalloc traced over its making, to 0.1%
    users, kernels, cells = store.sizes()
    assert (users, kernels, cells) == (
        USAGE_USERS.value, USAGE_KERNELS.value, USAGE_KERNELS.value * USAGE_CELLS.value
    )  # fmt: skip
    builds = []
    for _ in range(3):  # the median: the first build may meet a full collection of the heap
        started = time.perf_counter()
        body = usage_body(store, "root", True, None, None)
        text = json.dumps(body)
        builds.append(time.perf_counter() - started)
    took = statistics.median(builds)
    started = time.perf_counter()
    gc.collect()
    collected = time.perf_counter() - started
    assert len(body["cells"]) == USAGE_ROWS.value
    assert len(body["users"]) == USAGE_ROWS.value  # of 8,192 user rows held
    assert body["users"][0]["user"] == "user-0007".ljust(ORIGIN_CHARS.value, "u")  # last to run
    record(
        f"usage table at every bound: {held / 2**20:.0f} MiB held; an admin's whole "
        f"answer {len(text) / 2**20:.1f} MiB, {took * 1000:.0f} ms to build on the loop; "
        f"a full gc.collect() with it held {collected * 1000:.0f} ms"
    )
    assert held < 256 * 2**20  # bounded: rows x their size (measured about 100 MiB)


# -- history: the ring and the answer at every bound ------------------------------------------


def test_the_history_answer_at_every_bound():
    ring = HistoryRing()
    devices = [f"GPU-{d:02d}" for d in range(HISTORY_DEVICES.value * 3)]
    models = [f"model-{m:02d}-".ljust(120, "x") for m in range(HISTORY_MODELS.value * 5)]
    for t in range(HISTORY_SAMPLES.value * 2):
        memory = {d: {m: 1 + i + j for j, m in enumerate(models)} for i, d in enumerate(devices)}
        rates = {m: float(j) + 1 for j, m in enumerate(models)}
        ring.add(Sample(float(t), memory, {d: 50.0 for d in devices}, rates))
    assert len(ring) == HISTORY_SAMPLES.value
    for points in (HISTORY_POINTS.value, HISTORY_POINTS.value - 1, 7):
        started = time.perf_counter()
        text = json.dumps(history_body(ring, points, 2.0, True))
        took = time.perf_counter() - started
        samples = json.loads(text)["samples"]
        assert len(samples) <= points
        for s in samples:
            assert len(s["memory"]) <= HISTORY_DEVICES.value
            assert set(s["utilization"]) <= set(s["memory"])
            assert all(len(m) <= HISTORY_MODELS.value for m in s["memory"].values())
            assert len(s["tokens_per_second"]) <= HISTORY_MODELS.value
        record(f"history ?points={points}: {len(text) / 2**20:.2f} MiB, {took * 1000:.0f} ms")


async def test_points_past_the_bound_and_head(jp_fetch):
    past = {"points": str(HISTORY_POINTS.value + 1)}
    bob = {"Authorization": "token bob-token"}
    code, body = await refused(jp_fetch("llm", "api", "history", params=past, headers=bob))
    assert code == 400 and "history_points" in json.loads(body)["error"]
    r = await jp_fetch("llm", "api", "history", method="HEAD", headers=bob)
    assert r.code == 200 and r.body == b""


# -- the sampler: reads that hang or fail, and stopping ---------------------------------------

GPU = DeviceInfo("GPU-0", "CUDA", "Sim", total_memory=8, free_memory=4)


class Scheduler:
    """One model on GPU-0; ``hang`` makes the device list never come."""

    def __init__(self) -> None:
        self.hang, self.asked = False, 0
        self.models = [SimpleNamespace(key="m", node="", allocations=(
            SimpleNamespace(device="GPU-0", total=3),))]  # fmt: skip

    async def current_devices(self):
        self.asked += 1
        if self.hang:
            await asyncio.Event().wait()
        return [GPU]

    def loaded_models(self):
        return self.models


class StuckNVML:
    """Utilization read in an executor thread that blocks until released, or fails."""

    def __init__(self) -> None:
        self.release, self.reads, self.fail = threading.Event(), 0, False

    async def utilization(self, devices):
        self.reads += 1
        if self.fail:
            raise OSError("NVML: driver/library version mismatch")
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait)
        return {"GPU-0": 50.0}


async def test_a_hung_utilization_read_costs_the_line_not_the_sampler():
    nvml = StuckNVML()
    sampler = HistorySampler(Scheduler(), nvml, interval=0.01, tally=TokenTally())
    sampler.start()
    try:
        await until(lambda: len(sampler.ring) >= 20, what="samples while NVML hangs")
        assert sampler.running and nvml.reads == 1  # one stuck thread, not one per sample
        assert all(s.utilization == {} and s.memory == {"GPU-0": {"m": 3}}
                   for s in sampler.ring.samples())  # fmt: skip
        nvml.release.set()  # the driver answers again: utilization comes back
        await until(lambda: sampler.ring.samples()[-1].utilization == {"GPU-0": 50.0},
                    what="utilization after the hang")  # fmt: skip
        nvml.fail = True
        count = len(sampler.ring)
        await until(lambda: len(sampler.ring) >= min(count + 10, HISTORY_SAMPLES.value),
                    what="samples while NVML fails")  # fmt: skip
        assert sampler.running and sampler.ring.samples()[-1].utilization == {}
    finally:
        nvml.release.set()
        await sampler.stop()
    assert not sampler.running and sampler._reading is None


async def test_a_runner_that_never_answers_costs_points_then_sampling_resumes():
    scheduler = Scheduler()
    scheduler.models = []  # no model: the device list is read at every change
    sampler = HistorySampler(scheduler, StuckNVML(), interval=0.01, tally=TokenTally())
    sampler._source.release.set()
    scheduler.hang = True
    sampler.start()
    try:
        # each sample waits READ_WAIT intervals for the list, then the next one asks again
        await until(lambda: scheduler.asked >= 3, what="samples given up on the runner")
        assert sampler.running and len(sampler.ring) == 0
        scheduler.hang = False
        await until(lambda: len(sampler.ring) >= 3, what="samples once the runner answers")
    finally:
        await sampler.stop()


async def test_a_stopped_sampler_leaves_no_task_behind():
    before = asyncio.all_tasks()
    nvml = StuckNVML()  # never released: its read is in flight when the sampler stops
    sampler = HistorySampler(Scheduler(), nvml, interval=0.01, tally=TokenTally())
    sampler.start()
    sampler.start()  # a second start starts nothing
    await until(lambda: len(sampler.ring) >= 3, what="samples")
    await sampler.stop()
    await until(lambda: asyncio.all_tasks() - before <= {asyncio.current_task()},
                what="the sampler's tasks to end")  # fmt: skip
    nvml.release.set()  # the executor thread returns; nothing is waiting for it
    assert not sampler.running
