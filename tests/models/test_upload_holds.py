"""A blob uploaded with ``POST /api/blobs`` is held for its ``/api/create``:
deleting another model that used the same blob in between does not free it.
The hold ends when a create uses the blob, or after ``UPLOAD_HOLD`` seconds
(read from the store's clock, which these tests set by hand: no sleeping)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.models import store as store_module
from jupyter_llm.models.store import UPLOAD_HOLD, ModelStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, demo_gguf: Path, clock: Clock) -> ModelStore:
    store = ModelStore(tmp_path / "models", clock=clock)
    store.create("a", {"a.gguf": store.add_blob_from_file(demo_gguf)})
    return store


def upload(store: ModelStore, data: bytes) -> str:
    """What ``POST /api/blobs/<digest>`` does with a body."""
    writer = store.blob_writer()
    writer.write(data)
    return store.commit_upload(writer, f"sha256:{hashlib.sha256(data).hexdigest()}")


def holds_dir(store: ModelStore) -> list[Path]:
    directory = store.root / ".jupyter-llm" / "holds"
    return list(directory.iterdir()) if directory.is_dir() else []


def test_an_upload_survives_a_delete_until_its_create(store, demo_gguf):
    digest = upload(store, demo_gguf.read_bytes())  # the blob "a" uses too
    assert digest not in store.delete("a")  # "a" went; its upload is held for its create
    assert store.has_blob(digest)
    store.create("b", {"b.gguf": digest})
    assert holds_dir(store) == []  # the create used it: no hold is left
    assert digest in store.delete("b")  # and now nothing keeps it


def test_an_upload_is_held_for_a_bounded_time(store, demo_gguf, clock):
    digest = upload(store, demo_gguf.read_bytes())
    clock.now += UPLOAD_HOLD - 1
    assert digest not in store.delete("a")  # within the hour: held
    store.create("a", {"a.gguf": digest})
    clock.now += 2  # past the hour, and no create of its own came
    assert digest in store.delete("a")
    assert not store.has_blob(digest)


def test_another_store_on_the_same_directory_sees_the_hold_and_its_time(store, demo_gguf, clock):
    """A collector in another process reads the hold file and its time."""
    digest = upload(store, demo_gguf.read_bytes())
    other = ModelStore(store.root, clock=clock)
    assert digest not in other.delete("a")
    other.create("a", {"a.gguf": digest})  # another store's create: the hold stays
    clock.now += UPLOAD_HOLD + 1
    assert digest in other.delete("a")


def test_uploading_again_extends_the_hold(store, demo_gguf, clock):
    data = demo_gguf.read_bytes()
    digest = upload(store, data)
    clock.now += UPLOAD_HOLD - 10
    upload(store, data)  # a client retrying its upload
    clock.now += 20
    assert digest not in store.delete("a")
    assert store.has_blob(digest)


def test_the_number_of_held_uploads_is_bounded(store, demo_gguf, clock, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_UPLOAD_HOLDS", 2)
    first = upload(store, demo_gguf.read_bytes())  # the one "a" uses: expires first
    clock.now += 1
    upload(store, b"second")
    clock.now += 1
    upload(store, b"third")  # over the bound: the soonest to expire lets go
    assert store._uploads is not None and len(store._uploads.until) == 2
    assert first in store.delete("a")


def test_expired_uploads_are_dropped_from_the_hold(store, clock):
    upload(store, b"one")
    clock.now += UPLOAD_HOLD + 1
    two = upload(store, b"two")
    assert store._uploads is not None and list(store._uploads.until) == [two]


# -- through the API ---------------------------------------------------------------------------
async def test_a_blob_posted_then_deleted_with_its_model_still_creates(
    jp_fetch, installed_model, demo_gguf
):
    """HEAD says the blob is there; the client uploads it anyway (or another
    user does); the only model using it is deleted; the create still works."""
    data = demo_gguf.read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    r = await jp_fetch("llm", "api", "blobs", digest, method="POST", body=data)
    assert r.code == 201
    for name in ("tiny", "tiny2", "tiny3"):
        body = f'{{"model": "{name}"}}'
        await jp_fetch(
            "llm", "api", "delete", method="DELETE", body=body, allow_nonstandard_methods=True
        )
    r = await jp_fetch("llm", "api", "blobs", digest, method="HEAD")
    assert r.code == 200
    body = f'{{"model": "again", "files": {{"t.gguf": "{digest}"}}, "stream": false}}'
    r = await jp_fetch("llm", "api", "create", method="POST", body=body)
    assert r.code == 200
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "blobs", "sha256:" + "1" * 64, method="POST", body=b"x")
    assert info.value.code == 400  # a wrong digest is still refused, nothing held
