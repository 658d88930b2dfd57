"""Interactive before batch in the scheduler: the pure rules as tables, and
the scheduler handing out slots by them (fake runners, simulated devices)."""

from __future__ import annotations

import asyncio

import pytest
from scheduler_env import ONE_GPU, entry, make
from waiting import until

from jupyter_llm.api.ps import ps_body
from jupyter_llm.request.identity import Requester
from jupyter_llm.request.priority import BATCH, INTERACTIVE, seq_ids, spare_ids
from jupyter_llm.scheduler import LoadOptions
from jupyter_llm.scheduler.fair_queue import FairQueue, Waiter, next_waiter
from jupyter_llm.scheduler.priority import BATCH_PASSES, admits, batch_due, order, passes_after

INT, BAT = INTERACTIVE, BATCH


@pytest.mark.parametrize(
    ("slots", "spare", "ids"),
    [(1, 1, 2), (4, 4, 8), (128, 128, 256), (200, 56, 256), (256, 0, 256)],
)
def test_spare_sequence_ids(slots, spare, ids):
    assert spare_ids(slots) == spare and seq_ids(slots) == ids


@pytest.mark.parametrize(
    ("priority", "interactive", "running", "slots", "expected"),
    [
        (BAT, 0, 0, 2, True),  # a free slot
        (BAT, 0, 2, 2, False),  # batch never goes past the slots
        (BAT, 1, 1, 2, True),
        (INT, 0, 2, 2, True),  # every slot busy with batch work: one is paused for it
        (INT, 1, 3, 2, True),  # a second interactive request pauses the other
        (INT, 2, 4, 2, False),  # interactive work holds every slot: it waits
        (INT, 2, 2, 2, False),
        (INT, 0, 4, 2, False),  # no sequence id left
        (INT, 0, 1, 1, True),
        (INT, 1, 1, 1, False),
    ],
)
def test_admits(priority, interactive, running, slots, expected):
    assert admits(priority, interactive, running, slots) is expected


@pytest.mark.parametrize(
    ("passed", "served", "could", "expected"),
    [
        (0, INT, True, 1),
        (3, INT, True, 4),
        (3, INT, False, 3),  # batch could not have gone: not passed over
        (4, BAT, True, 0),
        (0, BAT, False, 0),
    ],
)
def test_passes_after(passed, served, could, expected):
    assert passes_after(passed, served, could) == expected


def test_order_and_when_batch_is_due():
    assert not batch_due(BATCH_PASSES - 1) and batch_due(BATCH_PASSES)
    assert order(INT, due=False) < order(BAT, due=False)
    assert order(BAT, due=True) < order(INT, due=True)


def waiters(spec: str) -> list[Waiter]:
    """``"a:m:batch b:m:interactive"``: user:model:priority in arrival order."""
    return [Waiter(u, m, i, p) for i, (u, m, p) in enumerate(w.split(":") for w in spec.split())]


@pytest.mark.parametrize(
    ("queue", "last_served", "passed", "expected"),
    [
        ("a:m:batch b:m:interactive", {}, {}, 1),  # interactive first, though later
        ("a:m:batch a:m:interactive", {}, {}, 1),  # a user's own chat passes their batch
        ("a:m:interactive b:m:interactive", {"a": 1}, {}, 1),  # then fairness
        ("a:m:batch b:m:interactive", {}, {"m": BATCH_PASSES}, 0),  # batch is due
        ("a:m:batch b:n:interactive", {}, {"m": BATCH_PASSES}, 0),
        ("a:n:batch b:m:interactive", {}, {"n": BATCH_PASSES - 1}, 1),
    ],
)
def test_next_waiter_puts_priority_before_fairness(queue, last_served, passed, expected):
    ws = waiters(queue)
    got = next_waiter(ws, last_served, {}, 0, lambda w: True, passed)
    assert got is ws[expected]


def test_the_queue_serves_batch_after_so_many_interactive_grants():
    q = FairQueue()
    q.push("a", "m", BAT)
    for _ in range(2 * BATCH_PASSES):
        q.push("b", "m", INT)
    served = [q.pop({}, 0, lambda w: True).priority for _ in range(BATCH_PASSES + 1)]
    assert served == [INT] * BATCH_PASSES + [BAT]
    assert q.queued_by_priority("m") == {"b": {INT: BATCH_PASSES}}


# -- the scheduler --------------------------------------------------------------------------------
ANN, BOB = Requester("ann"), Requester("bob")


async def test_a_chat_starts_while_batch_work_holds_every_slot():
    scheduler, _ = make(ONE_GPU, num_parallel=2)
    e = entry("m")
    held = [await scheduler.acquire(e, LoadOptions(), None, ANN, BAT) for _ in range(2)]
    queued = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, ANN, BAT))
    await until(lambda: scheduler.pending == 1, what="a batch request queued")
    # every slot holds batch work: chats are admitted at once (the runner pauses batch work)
    chats = [await asyncio.wait_for(scheduler.acquire(e, LoadOptions(), None, BOB), 5)]
    loaded = chats[0].loaded
    assert loaded.by_priority == {BAT: 2, INT: 1} and loaded.refcount == 3
    ps = ps_body(scheduler)["models"][0]["priorities"]
    assert ps == {INT: {"running": 1, "queued": 0}, BAT: {"running": 2, "queued": 1}}
    chats.append(await asyncio.wait_for(scheduler.acquire(e, LoadOptions(), None, BOB), 5))
    # chats in every slot, every spare id taken: a third chat waits
    third = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB))
    await until(lambda: scheduler.pending == 2, what="the third chat queued")
    chats.pop().release()
    chats.append(await asyncio.wait_for(third, 5))
    assert not queued.done()  # batch work only ever takes a free slot
    for lease in (*chats, *held):
        lease.release()
    (await asyncio.wait_for(queued, 5)).release()
    assert loaded.refcount == 0 and ps_body(scheduler)["models"][0]["priorities"] == {
        INT: {"running": 0, "queued": 0},
        BAT: {"running": 0, "queued": 0},
    }


async def test_a_free_slot_goes_to_the_chat_before_the_batch_request_queued_first():
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    first = await scheduler.acquire(e, LoadOptions(), None, BOB)  # interactive: no pausing
    batch = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, ANN, BAT))
    await until(lambda: scheduler.pending == 1, what="the batch request queued")
    chat = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, ANN))
    await until(lambda: scheduler.pending == 2, what="the chat queued")
    first.release()
    (await asyncio.wait_for(chat, 5)).release()
    assert not batch.done() or batch.result().loaded.by_priority[INT] == 0
    (await asyncio.wait_for(batch, 5)).release()


async def test_batch_requests_get_on_under_a_continuous_stream_of_chats():
    """One slot; a chat always waiting beside the batch requests: the batch
    requests still get the slot, once every BATCH_PASSES chats at least."""
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    served: list[str] = []

    async def request(who: Requester, priority: str) -> None:
        lease = await scheduler.acquire(e, LoadOptions(), None, who, priority)
        served.append(priority)
        lease.release()

    first = await scheduler.acquire(e, LoadOptions(), None, BOB)  # the slot is taken
    batch = [asyncio.create_task(request(ANN, BAT)) for _ in range(3)]
    chats = [asyncio.create_task(request(BOB, INT)) for _ in range(4 * BATCH_PASSES)]
    await until(lambda: scheduler.pending == len(batch) + len(chats), what="all queued")
    first.release()
    await asyncio.wait_for(asyncio.gather(*batch, *chats), 10)
    runs = "".join("b" if p == BAT else "i" for p in served)
    assert runs.count("b") == 3
    # at most BATCH_PASSES chats in a row while batch work waits, and the one
    # admitted beside each batch request under its spare id (the runner pauses)
    before_last_batch = runs[: runs.rindex("b")]
    bound = BATCH_PASSES + spare_ids(1)
    assert all(len(run) <= bound for run in before_last_batch.split("b")), runs
