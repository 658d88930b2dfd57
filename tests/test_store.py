import hashlib
import json

import pytest

from jupyter_llm.errors import InvalidRequest, ModelNotFound
from jupyter_llm.models.store import ModelStore


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
