"""Fair sharing between users: the pure queue policy (table-driven) and the
scheduler handing out slots with it (fake runners, simulated devices)."""

from __future__ import annotations

import asyncio

import pytest
from scheduler_env import ONE_GPU, entry, make
from waiting import until

from jupyter_llm.api.ps import ps_body
from jupyter_llm.request.errors import AllocationFailed, ModelLoadFailed
from jupyter_llm.request.identity import LOCAL, Requester, requester_of
from jupyter_llm.scheduler import LoadOptions
from jupyter_llm.scheduler.fair_queue import FairQueue, Waiter, may_wait, next_waiter, unload_now


def waiters(spec: str) -> list[Waiter]:
    """``"a:m a:m b:n"``: user:model in arrival order."""
    return [Waiter(*w.split(":"), i) for i, w in enumerate(spec.split())]


@pytest.mark.parametrize(
    ("queue", "last_served", "active", "limit", "full", "expected"),
    [
        ("", {}, {}, 0, set(), None),  # nobody waits
        ("a:m a:m b:m", {}, {}, 0, set(), 0),  # nobody served yet: arrival order
        ("a:m a:m b:m", {"a": 5}, {}, 0, set(), 2),  # b never served: b first
        ("a:m a:m b:m", {"a": 5, "b": 7}, {}, 0, set(), 0),  # a served longer ago
        ("a:m b:m c:m", {"a": 3, "b": 1, "c": 2}, {}, 0, set(), 1),  # least recent wins
        ("a:m a:m b:m", {}, {"a": 2}, 2, set(), 2),  # a at its limit: passed over
        ("a:m a:m", {}, {"a": 2}, 2, set(), None),  # ...queued, not failed
        ("a:m a:m", {}, {"a": 2}, 0, set(), 0),  # limit 0: no limit
        ("a:m b:n", {}, {}, 0, {"m"}, 1),  # m has no free slot: n's waiter goes
        ("a:m a:n b:m", {"b": 9}, {}, 0, {"m"}, 1),  # a's first servable request
        ("a:m b:m", {}, {}, 0, {"m"}, None),  # no slot anywhere
    ],
)
def test_next_waiter(queue, last_served, active, limit, full, expected):
    ws = waiters(queue)
    got = next_waiter(ws, last_served, active, limit, lambda w: w.model not in full)
    assert got is (ws[expected] if expected is not None else None)


def test_a_batch_does_not_starve_a_chat():
    """500 of a's prompts queued before b's one: b is served second."""
    q = FairQueue()
    for _ in range(500):
        q.push("a", "m")
    q.push("b", "m")
    order = [q.pop({}, 0, lambda w: True).user for _ in range(3)]
    assert order == ["a", "b", "a"]
    assert q.queued("m") == {"a": 498} and len(q) == 498


def test_round_robin_across_three_users():
    q = FairQueue()
    for user in "aaabbc":
        q.push(user, "m")
    assert [q.pop({}, 0, lambda w: True).user for _ in range(6)] == list("abcaba")


@pytest.mark.parametrize(
    ("holders", "requester", "admin", "now"),
    [
        ({}, "a", False, True),  # idle: unload now
        ({"a": 0}, "b", False, True),  # nothing running
        ({"a": 1}, "a", False, False),  # my own requests: when they end
        ({"a": 1}, "a", True, False),  # admin, but only my own: when they end
        ({"a": 1}, "b", False, False),  # another user's: deferred until idle
        ({"a": 1}, "b", True, True),  # an admin may cut them off
        ({"a": 1, "b": 1}, "b", True, True),
        ({"a": 1, "b": 1}, "b", False, False),
    ],
)
def test_unload_now(holders, requester, admin, now):
    assert unload_now(holders, requester, admin) is now


class HubUser:
    def __init__(self, model):
        self.hub_user = model


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (None, LOCAL),
        (object(), LOCAL),  # a plain jupyter_server user: the server's owner
        (HubUser({"name": "ann", "admin": False, "scopes": []}), Requester("ann")),
        (HubUser({"name": "root", "admin": True}), Requester("root", admin=True)),
        (HubUser({"name": "svc", "scopes": ["admin:services"]}), Requester("svc", admin=True)),
    ],
)
def test_requester_of(user, expected):
    assert requester_of(user) == expected


ANN, BOB = Requester("ann"), Requester("bob")
ROOT = Requester("root", admin=True)


async def test_the_next_slot_goes_to_the_user_served_least_recently():
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    first = await scheduler.acquire(e, LoadOptions(), None, ANN)
    served: list[str] = []

    async def request(who: Requester) -> None:
        lease = await scheduler.acquire(e, LoadOptions(), None, who)
        served.append(who.name)
        lease.release()

    batch = [asyncio.create_task(request(ANN)) for _ in range(5)]
    await until(lambda: scheduler.pending == 5)
    chat = asyncio.create_task(request(BOB))
    await until(lambda: scheduler.pending == 6)
    ps = ps_body(scheduler)["models"][0]["users"]
    assert ps == [
        {"name": "ann", "running": 1, "queued": 5},
        {"name": "bob", "running": 0, "queued": 1},
    ]
    first.release()
    await asyncio.gather(*batch, chat)
    assert served[0] == "bob"  # ann just had the slot: bob's chat goes first
    assert served.count("ann") == 5
    assert ps_body(scheduler)["models"][0]["users"] == []


async def test_a_user_over_the_limit_queues_while_others_get_slots():
    scheduler, _ = make(ONE_GPU, num_parallel=3, max_requests_per_user=1)
    e = entry("m")
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    second = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, ANN))
    await until(lambda: scheduler.pending == 1)
    bob = await scheduler.acquire(e, LoadOptions(), None, BOB)  # a slot is free for bob
    assert not second.done() and scheduler.pending == 1  # ann's second waits, not refused
    ann.release()
    (await second).release()
    bob.release()


async def test_unloading_another_users_model_waits_unless_admin():
    scheduler, factory = make(ONE_GPU, num_parallel=2)
    e = entry("m")
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    assert await scheduler.unload("m:latest", BOB)
    assert factory.runners[0].alive and scheduler.loaded_models()  # deferred
    ann.release()
    await until(lambda: not scheduler.loaded_models())  # idle: unloaded
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    await scheduler.unload("m:latest", ROOT)
    assert not factory.runners[1].alive and not scheduler.loaded_models()  # admin: now
    ann.release()


async def test_a_cancelled_waiter_leaves_the_queue():
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    waiting = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB))
    await until(lambda: scheduler.pending == 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert ps_body(scheduler)["models"][0]["users"] == [{"name": "ann", "running": 1, "queued": 0}]
    ann.release()
    (await scheduler.acquire(e, LoadOptions(), None, BOB)).release()  # the slot was freed


async def test_requests_queued_on_a_model_an_admin_unloads_load_it_again():
    scheduler, factory = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    bob = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB))
    await until(lambda: scheduler.pending == 1)
    await scheduler.unload("m:latest", ROOT)  # cuts ann off; bob was queued on it
    assert not factory.runners[0].alive
    lease = await asyncio.wait_for(bob, 10)
    assert lease.runner is factory.runners[1] and lease.runner.alive
    assert ps_body(scheduler)["models"][0]["users"] == [{"name": "bob", "running": 1, "queued": 0}]
    ann.release()  # the old runner's request ends: the new one is untouched
    assert factory.runners[1].alive and scheduler.pending == 0
    lease.release()


async def test_a_queued_request_whose_model_cannot_load_again_gets_the_reason():
    scheduler, factory = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    bob = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB))
    await until(lambda: scheduler.pending == 1)
    factory.fail = 1  # the next load fails
    await scheduler.unload("m:latest", ROOT)
    with pytest.raises(AllocationFailed, match="could not allocate"):
        await asyncio.wait_for(bob, 10)
    assert scheduler.pending == 0 and ps_body(scheduler)["models"] == []
    ann.release()


async def test_a_request_queued_on_a_runner_that_dies_loads_a_fresh_one():
    scheduler, factory = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    ann = await scheduler.acquire(e, LoadOptions(), None, ANN)
    bob = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB))
    await until(lambda: scheduler.pending == 1)
    factory.runners[0].kill()  # the runner crashes under ann's request
    ann.release()
    lease = await asyncio.wait_for(bob, 10)
    assert lease.runner is factory.runners[1] and lease.runner.alive
    lease.release()


async def test_shutdown_fails_the_queued_requests():
    scheduler, _ = make(ONE_GPU, num_parallel=1)
    e = entry("m")
    await scheduler.acquire(e, LoadOptions(), None, ANN)
    bob = asyncio.create_task(scheduler.acquire(e, LoadOptions(), None, BOB))
    await until(lambda: scheduler.pending == 1)
    await scheduler.shutdown()
    with pytest.raises(ModelLoadFailed, match="shutting down"):
        await asyncio.wait_for(bob, 10)


@pytest.mark.parametrize(
    ("waiting", "mine", "max_queue", "allowed"),
    [
        (0, 0, 512, True),
        (383, 383, 512, True),  # one user alone: three quarters of the queue
        (384, 384, 512, False),
        (384, 0, 512, True),  # the last quarter: for users holding less than a quarter
        (500, 127, 512, True),
        (500, 128, 512, False),
        (512, 0, 512, False),  # never past max_queue
        (0, 0, 1, True),
        (1, 0, 1, False),
    ],
)
def test_may_wait(waiting, mine, max_queue, allowed):
    assert may_wait(waiting, mine, max_queue) is allowed
