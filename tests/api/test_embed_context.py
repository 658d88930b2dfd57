"""Embeddings beside a chat at a long context (issue 24, item 5): the
embedding context is sized from the inputs, not from the chat's ``num_ctx``.
Made with the chat's 32k cells and a 32k-token batch, it asked llama.cpp
for 34.5 GB on Gemma 3 270M and every ``/api/embed`` answered 500. The
sizing policy itself is tested in ``test_embed_share``."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.models.store import ModelStore

LONG_CTX = 32768  # Gemma 3 270M's trained context


@pytest.fixture
def llm_config():
    """Gemma's long prompts decode faster on every core the test has (the
    default; in-process servers decode on one): the test's process waits on
    them, and does not take a core from the runner meanwhile."""
    return {"num_threads": 0}


@pytest.fixture
def gemma(models_dir, gemma_gguf) -> str:
    store = ModelStore(models_dir)
    store.create("gemma", {gemma_gguf.name: store.add_blob_from_file(gemma_gguf)})
    return "gemma"


async def post(jp_fetch, path: str, body: dict) -> dict:
    # a 32k context's load and prompt take seconds more than the client's 20 s default
    # on a loaded 2-core machine; the test is about the answers, not their speed
    r = await jp_fetch(
        "llm", *path.split("/"), method="POST", body=json.dumps(body), request_timeout=120
    )
    return json.loads(r.body)


async def test_embeddings_work_after_a_chat_at_a_long_context(jp_fetch, gemma):
    answer = await post(
        jp_fetch,
        "api/generate",
        {
            "model": gemma,
            "prompt": "Say hi.",
            "stream": False,
            "options": {"num_ctx": LONG_CTX, "num_predict": 2, "temperature": 0},
        },
    )
    assert answer["done"]
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)
    assert [m["context_length"] for m in ps["models"]] == [LONG_CTX]

    # as the client sent it: no options, on the runner the chat loaded
    first = await post(jp_fetch, "api/embed", {"model": gemma, "input": ["a", "b"]})
    assert len(first["embeddings"]) == 2
    assert all(len(v) == 640 for v in first["embeddings"])  # Gemma 3 270M's width
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)
    assert [m["context_length"] for m in ps["models"]] == [LONG_CTX]  # the same runner

    # an input longer than a chunk makes the context again, larger (and in pieces)
    long_text = " ".join(f"word{i}" for i in range(400))
    body = await post(jp_fetch, "api/embed", {"model": gemma, "input": long_text})
    assert body["prompt_eval_count"] > 512 and len(body["embeddings"]) == 1

    # one longer than the context is refused when asked not to cut it, as before
    too_long = "a " * (LONG_CTX + 100)
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, "api/embed", {"model": gemma, "input": too_long, "truncate": False})
    assert info.value.code == 400
    assert "exceeds the context length" in json.loads(info.value.response.body)["error"]

    # and the runner goes on: the short inputs again, on the larger context kept
    again = await post(jp_fetch, "api/embed", {"model": gemma, "input": ["a", "b"]})
    for got, was in zip(again["embeddings"], first["embeddings"], strict=True):
        assert max(abs(a - b) for a, b in zip(got, was, strict=True)) < 1e-4
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)
    assert [m["context_length"] for m in ps["models"]] == [LONG_CTX]
