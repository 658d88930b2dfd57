"""A draft model in the store: the Modelfile's DRAFT, the draft layer (its own
media type, its blob shared), and the vocabulary check at create time."""

from __future__ import annotations

import json

import pytest

from jupyter_llm.demo import DemoModelSpec, write_demo_model, write_projector
from jupyter_llm.models.draft import (
    MAX_VOCAB_DIFFERENCE,
    MEDIA_DRAFT,
    Vocabulary,
    draft_source,
    header_mismatch,
    vocabulary_mismatch,
)
from jupyter_llm.models.modelfile import parse_modelfile
from jupyter_llm.models.names import MAX_NAME_LENGTH, parse_model_name
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import InvalidRequest, ModelNotFound


@pytest.fixture(scope="module")
def draft_gguf(tmp_path_factory):
    """A smaller model with the demo model's vocabulary."""
    path = tmp_path_factory.mktemp("draft") / "small.gguf"
    return write_demo_model(path, DemoModelSpec(n_embd=32, n_layer=1, n_ff=64, seed=7))


def _model(tmp_path_factory, name, **spec):
    return write_demo_model(tmp_path_factory.mktemp("other") / name, DemoModelSpec(**spec))


@pytest.fixture
def store(tmp_path, demo_gguf):
    store = ModelStore(tmp_path)
    store.create("tiny", {"tiny.gguf": store.add_blob_from_file(demo_gguf)})
    return store


def _layers(store, name):
    raw = store.manifest_path(parse_model_name(name)).read_text()
    return json.loads(raw)["layers"]


# -- the Modelfile -----------------------------------------------------------------


def test_modelfile_draft_names_a_model_or_a_file():
    mf = parse_modelfile("FROM ./big.gguf\nDRAFT small:1b\n")
    assert mf.draft == "small:1b" and not mf.draft_file
    assert mf.create_request("x")["draft"] == "small:1b"
    mf = parse_modelfile('FROM big\ndraft "./small.gguf"')
    assert mf.draft == "./small.gguf" and mf.draft_file
    assert "draft" not in mf.create_request("x")  # the client uploads it
    assert parse_modelfile("FROM big").draft is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("FROM a\nDRAFT b\nDRAFT c", "line 3: a second DRAFT"),
        ("FROM a\nDRAFT", "line 2: DRAFT needs a model name or file"),
        ("DRAFT b", "no FROM line"),
    ],
)
def test_bad_draft_lines(text, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_modelfile(text)


def test_draft_source_is_one_digest_or_name():
    digest = "sha256:" + "ab" * 32
    assert draft_source(digest) == digest
    assert draft_source("sha256-" + "ab" * 32) == digest
    assert draft_source("small:1b") == parse_model_name("small:1b")
    for bad, match in (
        (["a", "b"], "draft must be a string"),
        (3, "draft must be a string"),
        ("", "draft is required"),
        ("x" * (MAX_NAME_LENGTH + 1), f"longer than {MAX_NAME_LENGTH}"),
        ("../x", "invalid model name"),
    ):
        with pytest.raises(InvalidRequest, match=match):
            draft_source(bad)


# -- the store -----------------------------------------------------------------------


def test_an_uploaded_draft_is_a_layer_of_its_own(store, draft_gguf):
    digest = store.add_blob_from_file(draft_gguf)
    entry = store.create("fast", draft=digest, from_model="tiny")
    assert entry.draft_path == store.blob_path(digest) and entry.draft_from == ""
    assert [la for la in _layers(store, "fast") if la["mediaType"] == MEDIA_DRAFT] == [
        {"mediaType": MEDIA_DRAFT, "digest": digest, "size": draft_gguf.stat().st_size}
    ]
    assert store.get("tiny").draft_path is None  # the base is untouched
    # a model created from it keeps its draft; copied, the copy has it too
    assert store.create("fast2", from_model="fast", system="s").draft_path == entry.draft_path
    assert store.copy("fast", "fast3").draft_path == entry.draft_path


def test_a_draft_named_by_model_shares_its_blob(store, draft_gguf):
    small = store.create("small", {"small.gguf": store.add_blob_from_file(draft_gguf)})
    entry = store.create("fast", from_model="tiny", draft=parse_model_name("small"))
    assert entry.draft_path == small.model_path and entry.draft_from == "small:latest"
    # deleting the draft model keeps the blob the other model uses; deleting both frees it
    blob = "sha256:" + small.model_path.name[7:]
    assert blob not in store.delete("small")  # its config goes
    assert entry.draft_path.is_file()
    assert blob in store.delete("fast")


def test_a_new_draft_replaces_the_bases(store, draft_gguf, demo_gguf):
    first = store.add_blob_from_file(draft_gguf)
    store.create("fast", from_model="tiny", draft=first)
    second = store.add_blob_from_file(demo_gguf)  # the model itself drafts as well
    entry = store.create("fast", from_model="fast", draft=second)
    assert [la["digest"] for la in _layers(store, "fast") if la["mediaType"] == MEDIA_DRAFT] == [
        second
    ]
    assert entry.draft_path == store.blob_path(second)


def test_a_draft_with_files(store, demo_gguf, draft_gguf):
    model, draft = store.add_blob_from_file(demo_gguf), store.add_blob_from_file(draft_gguf)
    entry = store.create("fast", {"tiny.gguf": model}, draft=draft)
    assert entry.model_path == store.blob_path(model)
    assert entry.draft_path == store.blob_path(draft)


def test_draft_errors(store, tmp_path):
    with pytest.raises(ModelNotFound):
        store.create("fast", from_model="tiny", draft=parse_model_name("nope"))
    with pytest.raises(InvalidRequest, match="has not been uploaded"):
        store.create("fast", from_model="tiny", draft="sha256:" + "1" * 64)
    projector = write_projector(tmp_path / "mmproj.gguf", 64)
    with pytest.raises(InvalidRequest, match="is a projector, not a language model"):
        store.create("fast", from_model="tiny", draft=store.add_blob_from_file(projector))
    with pytest.raises(ModelNotFound):
        store.get("fast")  # nothing written


def test_a_draft_with_another_vocabulary_is_refused(store, tmp_path_factory):
    other = _model(tmp_path_factory, "other.gguf", n_embd=32, n_layer=1, extra_tokens=("zz",))
    same_size = _model(tmp_path_factory, "same.gguf", n_embd=32, n_layer=1, extra_tokens=("yy",))
    extra = store.create("extra", {"o.gguf": store.add_blob_from_file(other)})
    # one more token than the model: within the bound, and equal where both have ids
    assert store.create("fast", from_model="tiny", draft=extra.name).draft_path is not None
    with pytest.raises(InvalidRequest) as e:
        store.create("fast", from_model="extra", draft=store.add_blob_from_file(same_size))
    assert str(e.value).startswith("draft model sha256:")
    assert "does not share extra:latest's vocabulary (token texts differ between ids 5 and" in str(
        e.value
    )
    many = tuple(f"t{i}" for i in range(MAX_VOCAB_DIFFERENCE + 1))
    big = _model(tmp_path_factory, "big.gguf", n_embd=32, n_layer=1, extra_tokens=many)
    with pytest.raises(InvalidRequest, match=r"at most 128 apart"):
        store.create("fast2", from_model="tiny", draft=store.add_blob_from_file(big))


def test_vocabulary_mismatch_of_equal_files(demo_gguf, draft_gguf):
    assert vocabulary_mismatch(demo_gguf, draft_gguf) == ""
    assert vocabulary_mismatch(draft_gguf, demo_gguf) == ""


V = Vocabulary(model="llama", n_vocab=1000, add_bos=True, bos=1, add_eos=False, eos=2)


@pytest.mark.parametrize(
    ("draft", "why"),
    [
        (V, ""),
        (Vocabulary("llama", 1000, True, 1, False, 9), ""),  # an eos not added may differ
        (Vocabulary("llama", 1000 + MAX_VOCAB_DIFFERENCE, True, 1, False, 2), ""),
        (Vocabulary("llama", 1000 - MAX_VOCAB_DIFFERENCE - 1, True, 1, False, 2), "apart"),
        (Vocabulary("gpt2", 1000, True, 1, False, 2), "tokenizer 'gpt2', the model's is 'llama'"),
        (Vocabulary("llama", 1000, True, 3, False, 2), "bos token 3, the model's is 1"),
        (Vocabulary("llama", 1000, False, 1, False, 2), "bos token not added"),
        (Vocabulary("llama", 1000, True, 1, True, 2), "eos token 2, the model's is not added"),
    ],
)
def test_header_mismatch(draft, why):
    found = header_mismatch(V, draft)
    assert (why in found and found) if why else found == ""


def test_a_pulled_manifests_draft_name_is_shown_only_when_valid(store, draft_gguf):
    digest = store.add_blob_from_file(draft_gguf)
    store.create("fast", from_model="tiny", draft=digest)
    path = store.manifest_path(parse_model_name("fast"))
    for name, shown in (("small:1b", "small:1b"), ("\x1b[31mred", ""), (["x"], ""), ("", "")):
        manifest = json.loads(path.read_text())
        for layer in manifest["layers"]:
            if layer["mediaType"] == MEDIA_DRAFT:
                layer["from"] = name
        path.write_text(json.dumps(manifest))
        entry = store.get("fast")
        assert entry.draft_from == shown and entry.draft_path == store.blob_path(digest)
