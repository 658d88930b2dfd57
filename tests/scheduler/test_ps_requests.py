"""``/api/ps`` lists each request on a model: its user, priority, state and
since when (issue 27), at most ``ps_requests`` of them. The scheduler runs over
fake runners and simulated devices; waits are on observed state, never sleeps."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest
from scheduler_env import ONE_GPU, entry, make
from waiting import until

from jupyter_llm.api.ps import ps_body
from jupyter_llm.request.identity import Requester
from jupyter_llm.request.limits import PS_REQUESTS
from jupyter_llm.request.priority import BATCH, INTERACTIVE
from jupyter_llm.scheduler import LoadOptions

ANN, BOB, CY = Requester("ann"), Requester("bob"), Requester("cy")


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def requests_of(scheduler) -> dict:
    (model,) = ps_body(scheduler)["models"]
    return model


async def test_running_and_queued_requests_show_with_their_priorities_and_states():
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    before = time.time()
    batch = await scheduler.acquire(e, LoadOptions(), None, ANN, BATCH)  # the one slot
    queued = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, CY, BATCH))
    await until(lambda: scheduler.pending == 1, what="a batch request queued")
    # every slot holds batch work: a chat runs at once (the runner pauses the batch sequence)
    chat = await asyncio.wait_for(scheduler.acquire(e, LoadOptions(), None, BOB), 5)
    model = requests_of(scheduler)
    shown = [{k: r[k] for k in ("user", "priority", "state")} for r in model["requests"]]
    assert shown == [
        {"user": "ann", "priority": BATCH, "state": "running"},
        {"user": "bob", "priority": INTERACTIVE, "state": "running"},
        {"user": "cy", "priority": BATCH, "state": "queued"},
    ]
    assert "requests_left_out" not in model
    since = [seconds(r["since"]) for r in model["requests"]]
    assert all(r["since"].endswith("Z") for r in model["requests"])
    assert before - 1 <= since[0] <= since[1] <= time.time() + 1  # by when they got their slot
    assert before - 1 <= since[2] <= time.time() + 1  # when it was queued
    assert set(model["requests"][0]) == {"user", "priority", "state", "since"}  # no prompt
    # the counts agree with the list
    assert model["priorities"] == {
        INTERACTIVE: {"running": 1, "queued": 0},
        BATCH: {"running": 1, "queued": 1},
    }
    batch.release()
    chat.release()
    moved = await asyncio.wait_for(queued, 5)
    (only,) = requests_of(scheduler)["requests"]
    assert (only["user"], only["priority"], only["state"]) == ("cy", BATCH, "running")
    assert seconds(only["since"]) >= since[2]  # admitted after it was queued
    moved.release()
    assert requests_of(scheduler)["requests"] == []


async def test_a_release_takes_its_own_request_off_the_list():
    """Two of one user's requests of one priority: the later one ends, the
    earlier one stays listed with its own admission."""
    scheduler, _ = make(ONE_GPU, num_parallel=2)
    e = entry("m")
    first = await scheduler.acquire(e, LoadOptions(), None, ANN)
    loaded = first.loaded
    (early,) = loaded.admitted
    second = await scheduler.acquire(e, LoadOptions(), None, ANN)
    assert len(loaded.admitted) == 2
    second.release()
    assert list(loaded.admitted) == [early]
    (shown,) = requests_of(scheduler)["requests"]
    assert seconds(shown["since"]) == pytest.approx(loaded.admitted[early], abs=1e-5)
    first.release()
    assert loaded.admitted == {} and requests_of(scheduler)["requests"] == []


async def test_a_request_that_leaves_the_queue_leaves_the_list():
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    held = await scheduler.acquire(e, LoadOptions(), None, ANN)
    gone = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB, BATCH))
    await until(lambda: scheduler.pending == 1, what="the batch request queued")
    assert [r["state"] for r in requests_of(scheduler)["requests"]] == ["running", "queued"]
    gone.cancel()
    await until(lambda: scheduler.pending == 0, what="the client gone")
    assert [r["user"] for r in requests_of(scheduler)["requests"]] == ["ann"]
    held.release()


async def test_the_list_is_cut_at_its_limit_and_counts_the_rest():
    cap = PS_REQUESTS.value
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    held = await scheduler.acquire(e, LoadOptions(), None, ANN)
    extra = 5
    waiting = [
        asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB, BATCH))
        for _ in range(cap - 1)
    ]
    await until(lambda: scheduler.pending == cap - 1, what="the queue filled to the limit")
    model = requests_of(scheduler)
    assert len(model["requests"]) == cap and "requests_left_out" not in model  # exactly at it
    waiting += [
        asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, CY, BATCH))
        for _ in range(extra)
    ]
    await until(lambda: scheduler.pending == cap - 1 + extra, what="the queue past the limit")
    model = requests_of(scheduler)
    assert len(model["requests"]) == cap and model["requests_left_out"] == extra
    assert model["requests"][0]["state"] == "running"  # the head: running first
    assert {r["user"] for r in model["requests"][1:]} == {"bob"}  # then in arrival order
    assert model["priorities"][BATCH]["queued"] == cap - 1 + extra  # counts stay complete
    for task in waiting:
        task.cancel()
    await until(lambda: scheduler.pending == 0, what="the queue emptied")
    held.release()
