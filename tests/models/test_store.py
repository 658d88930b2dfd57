import hashlib
import json

import pytest

from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import InvalidRequest, ModelNotFound


def test_blob_with_wrong_digest_is_not_kept(tmp_path):
    store = ModelStore(tmp_path)
    writer = store.blob_writer()
    writer.write(b"hello")
    wrong = "sha256:" + "0" * 64
    with pytest.raises(InvalidRequest, match="digest mismatch"):
        writer.commit(wrong)
    assert not store.has_blob(wrong)
    assert list(store.blobs_dir.iterdir()) == []  # no temp file left behind


def test_blob_with_right_digest_is_kept(tmp_path):
    store = ModelStore(tmp_path)
    digest = "sha256:" + hashlib.sha256(b"hello").hexdigest()
    writer = store.blob_writer()
    writer.write(b"hel")
    writer.write(b"lo")
    assert writer.commit(digest) == digest
    assert store.blob_path(digest).read_bytes() == b"hello"
    assert store.blob_path(digest).name == "sha256-" + digest[7:]


def test_create_writes_ollama_layout(tmp_path, demo_gguf):
    store = ModelStore(tmp_path)
    digest = store.add_blob_from_file(demo_gguf)
    entry = store.create("me/tiny:v1", {"tiny.gguf": digest}, system="be brief")
    manifest_path = tmp_path / "manifests/registry.ollama.ai/me/tiny/v1"
    manifest = json.loads(manifest_path.read_text())
    media = [layer["mediaType"] for layer in manifest["layers"]]
    assert media == ["application/vnd.ollama.image.model", "application/vnd.ollama.image.system"]
    assert entry.system == "be brief"
    assert entry.details["family"] == "llama"
    assert entry.details["quantization_level"] == "F32"
    assert entry.model_path == store.blob_path(digest)
    assert [e.name.display for e in store.list()] == ["me/tiny:v1"]


def test_create_refuses_missing_blob_and_non_gguf(tmp_path):
    store = ModelStore(tmp_path)
    with pytest.raises(InvalidRequest, match="not been uploaded"):
        store.create("x", {"x.gguf": "sha256:" + "1" * 64})
    digest = store.add_blob_bytes(b"not a model at all")
    with pytest.raises(InvalidRequest, match="not a GGUF"):
        store.create("x", {"x.gguf": digest})
    assert store.list() == []


def test_unknown_model(tmp_path):
    with pytest.raises(ModelNotFound, match="model 'nope:latest' not found"):
        ModelStore(tmp_path).get("nope")


def test_digest_traversal_refused(tmp_path):
    store = ModelStore(tmp_path)
    with pytest.raises(InvalidRequest):
        store.blob_path("sha256:../../etc/passwd")


def test_params_layer_is_checked_like_request_options(tmp_path, demo_gguf, caplog):
    """A pulled manifest's parameters pass the request checks: bad values and
    unknown names are dropped with a warning naming the model, the rest kept."""
    import logging

    from jupyter_llm.models.store import MEDIA_PARAMS

    store = ModelStore(tmp_path)
    digest = store.add_blob_from_file(demo_gguf)
    store.create("base", {"m.gguf": digest})
    manifest_path = tmp_path / "manifests/registry.ollama.ai/library/base/latest"
    manifest = json.loads(manifest_path.read_text())

    def with_params(raw: bytes) -> None:
        params = store.add_blob_bytes(raw)
        layer = {"mediaType": MEDIA_PARAMS, "digest": params, "size": len(raw)}
        manifest_path.write_text(json.dumps({**manifest, "layers": [*manifest["layers"], layer]}))

    hostile = {
        "num_ctx": 1 << 40,
        "temperature": "hot",
        "num_predict": 4,
        "stop": "<|im_end|>",
        "top_k": 40.0,
        "bogus": 1,
        "num_gpu": 1 << 70,
    }
    with_params(json.dumps(hostile).encode())
    with caplog.at_level(logging.WARNING):
        params = store.get("base").params
    assert params == {"num_predict": 4, "stop": ["<|im_end|>"], "top_k": 40}
    for name in ("num_ctx", "temperature", "bogus", "num_gpu"):
        assert name in caplog.text
    assert "base:latest" in caplog.text

    with_params(b"[1, 2]")  # not an object: nothing applies
    assert store.get("base").params == {}


def test_a_huge_text_layer_is_refused_not_read(tmp_path, demo_gguf, monkeypatch):
    """Template, system, params, messages, license and config blobs are read
    whole by every get(): one too large to be text is refused unread."""
    from jupyter_llm.models import store as store_module

    store = ModelStore(tmp_path)
    digest = store.add_blob_from_file(demo_gguf)
    store.create("big", {"m.gguf": digest}, system="x" * 2000)
    store.create("small", {"m.gguf": digest}, system="short")
    monkeypatch.setattr(store_module, "MAX_TEXT_LAYER", 1000)
    with pytest.raises(InvalidRequest, match="too large"):
        store.get("big")
    assert [e.name.display for e in store.list()] == ["small:latest"]


@pytest.mark.parametrize(
    "texts",
    [
        {"messages": [{"role": "user", "content": "m" * 1000}]},
        {"license": ["MIT", "x" * 1001]},
        {"template": "t" * 1001},
    ],
    ids=["messages", "license", "template"],
)
def test_a_text_too_large_to_read_back_is_refused_before_anything_is_written(
    tmp_path, demo_gguf, monkeypatch, texts
):
    from jupyter_llm.models import store as store_module

    store = ModelStore(tmp_path)
    digest = store.add_blob_from_file(demo_gguf)
    store.create("base", {"m.gguf": digest})
    monkeypatch.setattr(store_module, "MAX_TEXT_LAYER", 1000)
    with pytest.raises(InvalidRequest, match="too large"):
        store.create("big", None, from_model="base", **texts)
    assert not store.manifest_path(parse_model_name("big")).exists()
    assert [e.name.display for e in store.list()] == ["base:latest"]


def test_uploads_a_dead_server_left_are_removed_at_startup(tmp_path):
    """A server that died mid-upload left its temporary file in the blobs;
    nothing else ever removed it. One untouched for an hour is removed when
    a server starts on the store; one still being written is not."""
    import os
    import time

    from jupyter_llm.models.store import STALE_UPLOAD_SECONDS

    store = ModelStore(tmp_path)
    writer = store.blob_writer()
    writer.write(b"half a model")  # a live upload: left alone
    dead = store.blobs_dir / ".upload-dead"
    dead.write_bytes(b"the rest never came")
    old = time.time() - STALE_UPLOAD_SECONDS - 60
    os.utime(dead, (old, old))
    assert store.remove_stale_uploads() == 1
    assert not dead.exists()
    digest = "sha256:" + hashlib.sha256(b"half a model").hexdigest()
    assert writer.commit(digest) == digest  # the live one still lands


def test_a_name_in_another_case_is_the_stored_model(tmp_path, demo_gguf):
    """Ollama reads a name in any case (getExistingName): TINY is tiny:latest,
    for use, copy, delete, and a create or pull over it."""
    store = ModelStore(tmp_path)
    digest = store.add_blob_from_file(demo_gguf)
    store.create("Team/Tiny", {"t.gguf": digest})
    assert store.get("team/TINY:LATEST").name.display == "Team/Tiny:latest"
    assert store.copy("TEAM/tiny", "copy").name.display == "copy:latest"
    store.create("team/tiny", {"t.gguf": digest}, system="again")  # the same model, replaced
    assert sorted(e.name.display for e in store.list()) == ["Team/Tiny:latest", "copy:latest"]
    assert store.get("Team/Tiny").system == "again"
    store.create("TEAM/TINY:v2", {"t.gguf": digest})  # each part as stored, as Ollama's
    assert store.get("team/tiny:V2").name.display == "Team/Tiny:v2"
    store.delete("COPY")
    with pytest.raises(ModelNotFound):
        store.get("copy")
    with pytest.raises(ModelNotFound):
        store.get("nothing")
