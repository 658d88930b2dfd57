"""Blob collection: deleting or overwriting a model frees only the blobs nothing
else needs, even while other threads or processes write manifests."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading

import pytest
from waiting import until_sync

from jupyter_llm.models.store import ModelStore

DEADLINE = 30.0


def digests(store: ModelStore, name: str) -> set[str]:
    manifest = json.loads(store.manifest_path(store.get(name).name).read_bytes())
    return {la["digest"] for la in [*manifest["layers"], manifest["config"]]}


def lock_waiting(store: ModelStore) -> bool:
    lock = getattr(store, "lock", None)
    return lock is not None and lock.waiting > 0


@pytest.fixture
def store(tmp_path, demo_gguf):
    store = ModelStore(tmp_path / "models")
    digest = store.add_blob_from_file(demo_gguf)
    store.create("a", {"a.gguf": digest}, system="only a")
    return store


def race_delete_at_write(store: ModelStore, victim: str, monkeypatch) -> threading.Thread:
    """Make the next manifest write start ``delete(victim)`` in a thread and let
    the write go on only once that delete has finished or waits for the store lock."""
    real_write = ModelStore._write_atomic
    done = threading.Event()
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            store.delete(victim)
        except BaseException as e:  # reported by the test, not lost in a thread
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=delete)
    thread.errors = errors  # type: ignore[attr-defined]

    def write(path, data):
        monkeypatch.setattr(ModelStore, "_write_atomic", staticmethod(real_write))
        thread.start()
        until_sync(
            lambda: done.is_set() or lock_waiting(store), DEADLINE, "the delete to run or wait"
        )
        real_write(path, data)

    monkeypatch.setattr(ModelStore, "_write_atomic", staticmethod(write))
    return thread


def test_copy_racing_delete_keeps_the_blobs(store, monkeypatch):
    wanted = digests(store, "a")
    thread = race_delete_at_write(store, "a", monkeypatch)
    store.copy("a", "b")
    thread.join(DEADLINE)
    assert not thread.errors
    assert [e.name.display for e in store.list()] == ["b:latest"]
    assert all(store.has_blob(d) for d in wanted)
    assert store.get("b").system == "only a"


def test_create_from_a_model_racing_its_delete_keeps_the_blobs(store, monkeypatch):
    model_digest = store.get("a").model_path.name.replace("-", ":")
    thread = race_delete_at_write(store, "a", monkeypatch)
    store.create("b", from_model="a", system="b's own")
    thread.join(DEADLINE)
    assert not thread.errors
    assert store.has_blob(model_digest)
    assert all(store.has_blob(d) for d in digests(store, "b"))


def test_unreadable_manifest_stops_collection(store, caplog):
    store.copy("a", "b")
    shared = digests(store, "a")
    broken = store.manifest_path(store.get("b").name)
    broken.write_bytes(b'{"layers": [')  # truncated by a crash or another tool
    with caplog.at_level(logging.WARNING):
        assert store.delete("a") == []
    assert all(store.has_blob(d) for d in shared)
    assert str(broken) in caplog.text
    with pytest.raises(Exception, match="not found"):
        store.get("a")


def test_overwriting_a_name_frees_the_blobs_only_it_used(store, demo_gguf):
    store.copy("a", "keep")
    store.create("x", from_model="a", system="first")
    first = digests(store, "x") - digests(store, "a")
    assert first  # the "first" system layer
    store.create("x", from_model="a", system="second")
    assert not any(store.has_blob(d) for d in first)
    assert all(store.has_blob(d) for d in digests(store, "a") | digests(store, "x"))
    # a copy over a name frees what only the old manifest used
    second = digests(store, "x") - digests(store, "a")
    store.copy("a", "x")
    assert not any(store.has_blob(d) for d in second)
    # a pulled manifest written over a name does too
    store.create("y", from_model="a", system="pulled before")
    old = digests(store, "y") - digests(store, "a")
    raw = store.manifest_path(store.get("keep").name).read_bytes()
    store.write_manifest(store.get("y").name, raw)
    assert not any(store.has_blob(d) for d in old)
    assert all(store.has_blob(d) for d in digests(store, "keep"))


def test_a_second_process_copying_while_this_one_deletes(store, tmp_path):
    """The copy runs in another process and stops just before its manifest write;
    the delete here must wait for it (one lock across processes)."""
    script = textwrap.dedent(
        f"""
        import sys
        from jupyter_llm.models.store import ModelStore
        real = ModelStore._write_atomic
        def write(path, data):
            print("at write", flush=True)
            sys.stdin.readline()
            real(path, data)
        ModelStore._write_atomic = staticmethod(write)
        ModelStore({str(store.root)!r}).copy("a", "c")
        print("copied", flush=True)
        """
    )
    wanted = digests(store, "a")
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "at write"
        done = threading.Event()
        thread = threading.Thread(target=lambda: (store.delete("a"), done.set()))
        thread.start()
        until_sync(
            lambda: done.is_set() or lock_waiting(store), DEADLINE, "the delete to run or wait"
        )
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "copied"
        assert child.wait(DEADLINE) == 0
        thread.join(DEADLINE)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert done.is_set()
    assert [e.name.display for e in store.list()] == ["c:latest"]
    assert all(store.has_blob(d) for d in wanted)


def test_held_blobs_survive_collection_until_released(store):
    """A pull holds the blobs it reuses or downloads until its manifest is written."""
    wanted = digests(store, "a")
    hold = store.hold(wanted)
    try:
        assert store.delete("a") == []
        assert all(store.has_blob(d) for d in wanted)
    finally:
        hold.release()
    assert not (store.root / ".jupyter-llm" / "holds").exists() or not list(
        (store.root / ".jupyter-llm" / "holds").iterdir()
    )


def test_a_hold_left_by_a_dead_process_is_ignored(store):
    wanted = digests(store, "a")
    script = (
        "import os; from jupyter_llm.models.store import ModelStore; "
        f"ModelStore({str(store.root)!r}).hold({sorted(wanted)!r}); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=DEADLINE)
    assert set(store.delete("a")) == wanted


def test_lock_is_reentrant_and_excludes_other_processes(store):
    with store.lock, store.lock:  # reentrant inside one thread
        held = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from jupyter_llm.models.store import ModelStore; "
                f"sys.exit(0 if not ModelStore({str(store.root)!r}).lock.acquire(blocking=False)"
                " else 1)",
            ],
            timeout=DEADLINE,
        )
        assert held.returncode == 0  # the other process could not take it
    free = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from jupyter_llm.models.store import ModelStore; "
            f"sys.exit(0 if ModelStore({str(store.root)!r}).lock.acquire(blocking=False) else 1)",
        ],
        timeout=DEADLINE,
    )
    assert free.returncode == 0
