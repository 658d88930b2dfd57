"""Embeddings are pooled as the GGUF declares (mean, CLS, last; last for a
model that declares none) and normalised as Ollama does: each route's vectors
equal llama.cpp's own (``llama_cpp.Llama(embedding=True)``, which pools as
the model says) on generated models of each kind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import llama_cpp
import pytest
from tornado.httpclient import HTTPClientError
from vectors import cosine

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.pooling import (
    embedding_pooling,
    finish_vector,
    fit_tokens,
    legacy_normalizes,
)
from jupyter_llm.runner.protocol import InputError

NONE, MEAN, CLS, LAST, RANK = (
    llama_cpp.LLAMA_POOLING_TYPE_NONE,
    llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    llama_cpp.LLAMA_POOLING_TYPE_CLS,
    llama_cpp.LLAMA_POOLING_TYPE_LAST,
    llama_cpp.LLAMA_POOLING_TYPE_RANK,
)
TEXTS = ["hello there", "the cat sat on the mat", "x"]
TOLERANCE = 1e-5


# -- the policy, table-driven -------------------------------------------------------
@pytest.mark.parametrize(
    ("declared", "used"),
    [
        (MEAN, MEAN),
        (CLS, CLS),
        (LAST, LAST),
        (NONE, LAST),  # a generative model: its last token, as Ollama's llama.cpp runner gave
        (llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED, LAST),
    ],
)
def test_pooling_used(declared, used):
    assert embedding_pooling(declared) == used


def test_a_reranker_gives_no_embeddings():
    with pytest.raises(InputError, match="reranker"):
        embedding_pooling(RANK)


# Ollama's llm.legacyEmbeddingsWereRaw, negated.
@pytest.mark.parametrize(
    ("arch", "pooling", "tokenizer", "flag", "normalized"),
    [
        ("llama", False, "gpt2", None, False),  # no pooling type: the raw runner output
        ("qwen3", True, "gpt2", None, True),
        ("gemma-embedding", True, "llama", None, True),
        ("bert", True, "bert", None, True),
        ("bert", True, "bert", False, False),
        ("bert", True, "gpt2", None, False),  # bert with another tokenizer stays raw
        ("nomic-bert", True, "bert", None, False),
        ("nomic-bert", True, "bert", True, True),
        ("nomic-bert-moe", True, "bert", None, False),
    ],
)
def test_legacy_route_normalisation(arch, pooling, tokenizer, flag, normalized):
    assert legacy_normalizes(arch, pooling, tokenizer, flag) is normalized


@pytest.mark.parametrize(
    ("vector", "dimensions", "normalize", "expected"),
    [
        ([3.0, 4.0], None, True, [0.6, 0.8]),
        ([3.0, 4.0, 12.0], 2, True, [0.6, 0.8]),  # cut, then normalised again
        ([3.0, 4.0, 12.0], 2, False, [3.0, 4.0]),
        ([3.0, 4.0], 5, True, [0.6, 0.8]),
        ([0.0, 0.0], None, True, [0.0, 0.0]),  # a zero vector stays zero
    ],
)
def test_finish_vector(vector, dimensions, normalize, expected):
    assert finish_vector(vector, dimensions, normalize) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_embedding_is_an_error(bad):
    with pytest.raises(InputError, match="NaN or Inf"):
        finish_vector([1.0, bad], None, True)


@pytest.mark.parametrize(
    ("full", "plain", "limit", "expected"),
    [
        ([9, 1, 2, 3, 8], [1, 2, 3], 10, [9, 1, 2, 3, 8]),  # fits: unchanged
        ([9, 1, 2, 3, 8], [1, 2, 3], 4, [9, 1, 2, 8]),  # CLS ... SEP kept
        ([1, 2, 3, 8], [1, 2, 3], 3, [1, 2, 8]),  # a final EOS kept (last pooling)
        ([9, 1, 2, 3], [1, 2, 3], 2, [9, 1]),
        ([9, 1, 2, 3, 8], [1, 2, 3], 2, [9, 1]),  # no room for text: the head
        ([9, 5, 6, 8], [1, 2, 3], 3, [9, 5, 6]),  # not found: the tail is cut
    ],
)
def test_fit_tokens(full, plain, limit, expected):
    assert fit_tokens(full, plain, limit) == expected


# -- against llama.cpp, through the server ------------------------------------------
KINDS = {
    # name: (spec, the pooling llama.cpp must be asked for to give our vectors)
    "llama-none": (DemoModelSpec(context_length=128), LAST),
    "llama-mean": (DemoModelSpec(context_length=128, pooling_type=MEAN), MEAN),
    "qwen3-last": (DemoModelSpec(arch="qwen3", context_length=128, pooling_type=LAST), LAST),
    "bert-mean": (
        DemoModelSpec(arch="bert", n_head_kv=4, context_length=128, pooling_type=MEAN),
        MEAN,
    ),
    "bert-cls": (
        DemoModelSpec(arch="bert", n_head_kv=4, context_length=128, pooling_type=CLS),
        CLS,
    ),
}


@pytest.fixture(scope="module")
def kind_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pooling")
    return {
        name: write_demo_model(root / f"{name}.gguf", spec) for name, (spec, _) in KINDS.items()
    }


@pytest.fixture(scope="module")
def references(kind_files) -> dict[tuple[str, int, bool], list[list[float]]]:
    """llama.cpp's own vectors for TEXTS, by (kind, pooling, normalised)."""
    cache: dict[tuple[str, int, bool], list[list[float]]] = {}

    def get(kind: str, pooling: int, normalize: bool) -> list[list[float]]:
        key = (kind, pooling, normalize)
        if key not in cache:
            cache[key] = reference(kind_files[kind], pooling, normalize)
        return cache[key]

    return get  # type: ignore[return-value]


def reference(path: Path, pooling: int, normalize: bool) -> list[list[float]]:
    """llama-cpp-python's high-level embedding: the model's own pooling when
    it declares one (what ``pooling`` must then be), else every token's
    vector, of which the last is taken."""
    llm = llama_cpp.Llama(
        str(path), embedding=True, n_ctx=128, n_batch=128, n_ubatch=128, n_threads=1, verbose=False
    )
    try:
        own = llm.pooling_type()
        assert own in (pooling, NONE)
        out = []
        for text in TEXTS:
            vector = llm.embed(text, normalize=normalize)
            out.append(vector[-1] if own == NONE else vector)
        return out
    finally:
        llm.close()


def forced(path: Path, pooling: int) -> list[list[float]]:
    """llama.cpp's normalised vectors with a pooling forced (a wrong one)."""
    llm = llama_cpp.Llama(
        str(path),
        embedding=True,
        n_ctx=128,
        n_batch=128,
        n_ubatch=128,
        n_threads=1,
        pooling_type=pooling,
        verbose=False,
    )
    try:
        return [llm.embed(text, normalize=True) for text in TEXTS]
    finally:
        llm.close()


def install(models_dir: Path, path: Path, name: str) -> None:
    from jupyter_llm.models.store import ModelStore

    store = ModelStore(models_dir)
    store.create(name, {path.name: store.add_blob_from_file(path)})


async def post(jp_fetch, path: str, body: dict) -> dict:
    r = await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return json.loads(r.body)


def assert_close(got: list[list[float]], expected: list[list[float]]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert len(g) == len(e)
        assert max(abs(a - b) for a, b in zip(g, e, strict=True)) < TOLERANCE


@pytest.mark.parametrize("kind", list(KINDS))
async def test_every_route_matches_llama_cpp(jp_fetch, models_dir, kind_files, references, kind):
    spec, pooling = KINDS[kind]
    install(models_dir, kind_files[kind], kind)
    expected = references(kind, pooling, True)

    body = await post(jp_fetch, "api/embed", {"model": kind, "input": TEXTS})
    assert_close(body["embeddings"], expected)
    assert all(abs(sum(v * v for v in e) - 1) < 1e-5 for e in body["embeddings"])

    body = await post(jp_fetch, "v1/embeddings", {"model": kind, "input": TEXTS})
    assert_close([d["embedding"] for d in body["data"]], expected)

    # dimensions: the first n values, normalised again (Ollama's order of operations)
    body = await post(jp_fetch, "api/embed", {"model": kind, "input": TEXTS, "dimensions": 8})
    assert_close(body["embeddings"], [finish_vector(e, 8, True) for e in expected])

    # the legacy route: normalised or raw as Ollama's is for this model
    normalized = spec.pooling_type is not None and spec.arch != "bert"  # bert: not WordPiece
    legacy = references(kind, pooling, normalized)
    for text, want in zip(TEXTS, legacy, strict=True):
        body = await post(jp_fetch, "api/embeddings", {"model": kind, "prompt": text})
        assert_close([body["embedding"]], [want])

    # another pooling gives another vector (of the first text, whose first
    # and last tokens differ), so the match above means something
    wrong = MEAN if pooling != MEAN else LAST
    assert cosine(expected[0], forced(kind_files[kind], wrong)[0]) < 0.9


async def test_truncation_keeps_the_cls_token_and_refuses_when_asked(
    jp_fetch, models_dir, kind_files
):
    install(models_dir, kind_files["bert-cls"], "cls")
    long_text = "a" * 400  # one token per letter, plus the leading CLS (BOS)
    body = await post(jp_fetch, "api/embed", {"model": "cls", "input": long_text})
    llm = llama_cpp.Llama(
        str(kind_files["bert-cls"]),
        embedding=True,
        n_ctx=128,
        n_batch=128,
        n_ubatch=128,
        n_threads=1,
        verbose=False,
    )
    try:
        expected = llm.embed("a" * 127, normalize=True)  # CLS + 127 letters = the context
    finally:
        llm.close()
    assert_close(body["embeddings"], [expected])
    assert body["prompt_eval_count"] == 128
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, "api/embed", {"model": "cls", "input": long_text, "truncate": False})
    assert info.value.code == 400 and "context length" in info.value.response.body.decode()


async def test_a_reranker_is_a_clear_400(jp_fetch, models_dir, tmp_path):
    spec = DemoModelSpec(arch="bert", n_head_kv=4, context_length=128, pooling_type=RANK)
    install(models_dir, write_demo_model(tmp_path / "rank.gguf", spec), "rank")
    for path, body in (
        ("api/embed", {"model": "rank", "input": "hello"}),
        ("v1/embeddings", {"model": "rank", "input": "hello"}),
    ):
        with pytest.raises(HTTPClientError) as info:
            await post(jp_fetch, path, body)
        assert info.value.code == 400 and "reranker" in info.value.response.body.decode()


# -- the generated models -----------------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "pooling"), [("llama", None), ("llama", MEAN), ("qwen3", LAST), ("bert", CLS)]
)
def test_demo_models_declare_the_pooling_asked(tmp_path, arch, pooling):
    import gguf

    spec = DemoModelSpec(arch=arch, pooling_type=pooling, n_head_kv=4 if arch == "bert" else 2)
    reader = gguf.GGUFReader(str(write_demo_model(tmp_path / "m.gguf", spec)))
    assert reader.get_field("general.architecture").contents() == arch
    field = reader.get_field(f"{arch}.pooling_type")
    assert (field.contents() if field else None) == pooling
    names = {t.name for t in reader.tensors}
    assert ("blk.0.attn_q_norm.weight" in names) == (arch == "qwen3")
    assert ("position_embd.weight" in names) == (arch == "bert")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (DemoModelSpec(arch="gpt9"), "arch must be one of"),
        (DemoModelSpec(arch="bert"), "n_head_kv == n_head"),
    ],
)
def test_demo_refuses_a_bad_shape(tmp_path, spec, match):
    with pytest.raises(ValueError, match=match):
        write_demo_model(tmp_path / "m.gguf", spec)
