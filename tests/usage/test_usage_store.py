"""The usage table: rows per user and per kernel, cell and model, and its
bounds (every LRU keeps at most its limit, whatever the clients send)."""

from __future__ import annotations

from jupyter_llm.request.limits import (
    USAGE_CELLS,
    USAGE_KERNELS,
    USAGE_MODELS,
    USAGE_ROWS,
    USAGE_USER_KERNELS,
    USAGE_USERS,
)
from jupyter_llm.request.origin import NO_ORIGIN, Origin
from jupyter_llm.usage import Sample, UsageStore


def one(model="m", generated=4):
    return Sample(model, prompt_tokens=2, generated_tokens=generated, first_token_s=0.1,
                  decode_s=0.5, held_s=1.0, devices=1)  # fmt: skip


def test_the_defaults_are_the_limits_table():
    assert UsageStore().bounds == (
        USAGE_KERNELS.value, USAGE_CELLS.value, USAGE_USERS.value, USAGE_MODELS.value
    )  # fmt: skip


def test_rows_per_user_and_per_cell():
    store = UsageStore()
    k = Origin("k1", "cell-a", 3)
    store.record("alice", k, one(), now=1)
    store.record("alice", k, one(generated=6), now=2)
    store.record("alice", Origin("k1", "", 4), one("other"), now=3)
    store.record("bob", NO_ORIGIN, one(), now=4)
    users = {(r["user"], r["model"]): r for r in store.user_rows()}
    assert users["alice", "m"]["requests"] == 2 and users["alice", "m"]["generated_tokens"] == 10
    assert users["alice", "other"]["requests"] == 1 and users["bob", "m"]["requests"] == 1
    cells = store.cell_rows("alice", "k1")
    assert [(r["cell"], r["execution_count"], r["model"], r["requests"]) for r in cells] == [
        ("cell-a", 3, "m", 2),
        ("In [4]", 4, "other", 1),  # a cell without an id is its execution count
    ]
    bob = [(r["kernel"], r["cell"]) for r in store.cell_rows("bob")]
    assert bob == [("api", "")]  # other clients are "api"
    assert store.cell_rows("alice", "k2") == [] and store.user_rows("carol") == []


def test_ten_thousand_kernels_keep_at_most_the_bound():
    store = UsageStore()
    for i in range(10_000):
        store.record(f"user{i % 2000}", Origin(f"kernel-{i}", f"c{i}", i), one(), now=i)
    users, kernels, cells = store.sizes()
    assert kernels == USAGE_KERNELS.value and cells == USAGE_KERNELS.value
    assert users == min(2000, USAGE_USERS.value)
    newest = store.cell_rows()[0]
    assert newest["kernel"] == "kernel-9999"  # the most recently active kept, first
    assert all(r["kernel"] != "kernel-0" for r in store.cell_rows())


def test_cells_and_models_per_kernel_are_bounded():
    store = UsageStore(cells=3, models=2)
    for i in range(10):
        store.record("alice", Origin("k", f"c{i}", i), one(f"model{i % 4}"), now=i)
    assert [r["cell"] for r in store.cell_rows()] == ["c7", "c8", "c9"]
    assert [r["model"] for r in store.user_rows("alice")] == ["model0", "model1"]


def test_an_answer_has_at_most_usage_rows():
    store = UsageStore()
    for i in range(USAGE_ROWS.value + 50):
        store.record(f"u{i % 10}", Origin(f"k{i % 200}", f"c{i}", i), one(), now=i)
    assert len(store.cell_rows()) == USAGE_ROWS.value


def test_one_user_naming_new_kernels_drops_only_their_own():
    store = UsageStore(kernels=8, user_kernels=3)
    for i in range(4):
        store.record(f"victim{i}", Origin(f"v{i}", "c", 1), one(), now=i)
    for i in range(1000):
        store.record("mallory", Origin(f"m{i}", "c", 1), one(), now=10 + i)
    kernels = [(r["user"], r["kernel"]) for r in store.cell_rows()]
    assert kernels[:3] == [("mallory", "m999"), ("mallory", "m998"), ("mallory", "m997")]
    assert sorted(kernels[3:]) == [(f"victim{i}", f"v{i}") for i in range(4)]
    assert UsageStore().user_kernels == USAGE_USER_KERNELS.value
