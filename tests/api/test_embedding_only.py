"""A model that only embeds (a BERT encoder: a pooling type, no output
layer) is refused generation before anything loads, as Ollama refuses it
("does not support generate"). llama.cpp made every token of its prompt an
output and aborted the runner (GGML_ASSERT n_outputs_max) with every stream
on it; the runner refuses it too, for a GGUF that declares no pooling."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import InputError, LoadParams

BERT = DemoModelSpec(arch="bert", n_head_kv=4, pooling_type=1, chat_template="")


@pytest.fixture
def bert(models_dir, tmp_path) -> str:
    path = write_demo_model(tmp_path / "bert.gguf", BERT)
    store = ModelStore(models_dir)
    store.create("bert", {path.name: store.add_blob_from_file(path)})
    return "bert:latest"


async def refused(jp_fetch, path: str, body: dict) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return e.value.code, json.loads(e.value.response.body)


@pytest.mark.parametrize(
    ("path", "body", "route"),
    [
        ("api/generate", {"prompt": "hello world " * 60}, "generate"),
        ("api/chat", {"messages": [{"role": "user", "content": "hi"}]}, "chat"),
    ],
)
async def test_an_embedding_model_is_refused_generation(jp_fetch, bert, path, body, route):
    code, answer = await refused(jp_fetch, path, {"model": bert, **body})
    assert (code, answer) == (400, {"error": f'"{bert}" does not support {route}'})
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)
    assert ps["models"] == []  # refused before a load


async def test_an_embedding_model_is_refused_by_the_openai_routes(jp_fetch, bert):
    body = {"model": bert, "messages": [{"role": "user", "content": "hi"}]}
    code, answer = await refused(jp_fetch, "v1/chat/completions", body)
    assert code == 400
    assert answer["error"]["message"] == f'"{bert}" does not support chat'


async def test_an_embedding_model_still_embeds(jp_fetch, bert):
    body = {"model": bert, "input": ["a", "b"]}
    r = await jp_fetch("llm", "api", "embed", method="POST", body=json.dumps(body))
    assert len(json.loads(r.body)["embeddings"]) == 2


def test_the_runner_refuses_to_generate_with_an_encoder(tmp_path):
    """The runner's own guard, whatever the server knew: a long prompt (more
    tokens than the context's logit rows) aborted the process."""
    from engine_run import EngineRun

    path = write_demo_model(tmp_path / "bert.gguf", BERT)
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_seq=2))
    try:
        with pytest.raises(InputError, match="only embeds"):
            EngineRun(engine, "hello world " * 60, "interactive", num_predict=4)
    finally:
        engine.close()


async def test_an_embedding_model_is_refused_by_the_openai_completions(jp_fetch, bert):
    code, answer = await refused(jp_fetch, "v1/completions", {"model": bert, "prompt": "hi"})
    assert code == 400
    assert answer["error"]["message"] == f'"{bert}" does not support generate'


def test_each_route_names_itself():
    """The refusal says what Ollama's does: generate for a prompt's routes,
    chat for the others."""
    from jupyter_llm.api.ollama_shapes import chat_call, generate_call
    from jupyter_llm.api.openai_shapes import chat_call as openai_chat
    from jupyter_llm.api.openai_shapes import completion_call

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert generate_call({"model": "m", "prompt": "hi"}).generation.route == "generate"
    assert chat_call(chat).generation.route == "chat"
    assert completion_call({"model": "m", "prompt": "hi"}).generation.route == "generate"
    assert openai_chat(chat).generation.route == "chat"
    # the exchange's tokens come back on Ollama's generate alone
    assert generate_call({"model": "m", "prompt": "hi"}).generation.with_context
    assert not completion_call({"model": "m", "prompt": "hi"}).generation.with_context
    assert not chat_call(chat).generation.with_context


@pytest.mark.parametrize(
    ("path", "body", "route"),
    [("api/generate", {}, "generate"), ("api/chat", {"messages": []}, "chat")],
)
async def test_a_generation_routes_load_of_an_embedding_model_is_refused(
    jp_fetch, bert, path, body, route
):
    """Nothing to generate loads the model, on a route that generates: as
    Ollama, not a model that only embeds; ``/api/embed`` with no input loads it."""
    code, answer = await refused(jp_fetch, path, {"model": bert, **body})
    assert (code, answer) == (400, {"error": f'"{bert}" does not support {route}'})
    r = await jp_fetch("llm", "api", "embed", method="POST", body=json.dumps({"model": bert}))
    assert json.loads(r.body)["embeddings"] == []
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)
    assert [m["name"] for m in ps["models"]] == [bert]
