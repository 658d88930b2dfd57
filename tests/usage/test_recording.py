"""The edge ``api.generation`` opens per request: the origin read from the
handler's context, the devices the model sits on, the runner's figures."""

from __future__ import annotations

import time
from types import SimpleNamespace

from jupyter_llm.request.origin import ORIGIN, Origin
from jupyter_llm.usage import UsageStore
from jupyter_llm.usage.recording import Held


def lease(*sizes: tuple[str, int]) -> SimpleNamespace:
    allocations = [SimpleNamespace(device=d, total=n) for d, n in sizes]
    return SimpleNamespace(loaded=SimpleNamespace(allocations=allocations))


def test_a_request_is_counted_under_its_origin_and_devices():
    store = UsageStore()
    token = ORIGIN.set(Origin("k1", "c1", 2))
    try:
        held = Held(store, "alice", "m", lease(("GPU-0", 5), ("GPU-1", 5), ("cpu", 0)),
                    time.perf_counter_ns())  # fmt: skip
    finally:
        ORIGIN.reset(token)
    assert held.devices == 2  # a device holding nothing is not counted
    held.done(7, 3, 300_000_000)
    held.close(first_token=time.perf_counter())
    [row] = store.cell_rows()
    where = (row["user"], row["kernel"], row["cell"], row["execution_count"])
    assert where == ("alice", "k1", "c1", 2)
    assert (row["prompt_tokens"], row["generated_tokens"], row["decode_seconds"]) == (7, 3, 0.3)
    assert row["tokens_per_second"] == 10.0 and row["time_to_first_token"] >= 0


def test_a_cancelled_request_counts_its_slot_time_and_no_first_token():
    store = UsageStore()
    held = Held(store, "bob", "m", lease(), time.perf_counter_ns())
    assert held.devices == 1  # no allocation known: one device held it
    held.close()
    [row] = store.user_rows()
    assert row["requests"] == 1 and row["generated_tokens"] == 0
    assert row["time_to_first_token"] is None and row["device_seconds"] >= 0
    assert store.cell_rows()[0]["kernel"] == "api"
