"""``/api/create``'s ``draft`` and ``/api/show`` of a model with a draft model;
a Modelfile's DRAFT file uploaded by the client (``jupyter llm create``)."""

from __future__ import annotations

import json

import pytest
from live_server import LiveServer
from tornado.httpclient import HTTPClientError

from jupyter_llm.connect.create import create_from_modelfile
from jupyter_llm.connect.endpoint import LLMClientError, ServerEndpoint
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.draft import MEDIA_DRAFT
from jupyter_llm.models.store import ModelStore


@pytest.fixture(scope="module")
def draft_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("draft") / "small.gguf"
    return write_demo_model(path, DemoModelSpec(n_embd=32, n_layer=1, n_ff=64, seed=3))


@pytest.fixture
def llm_config() -> dict:
    return {"new_estimates": True}  # /api/ps shows the buffers the runner measured


async def post(jp_fetch, path, body):
    r = await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def test_create_with_a_draft_model_and_show_it(jp_fetch, installed_model, models_dir):
    # the same file as a draft: a model drafts for itself here (one blob, shared)
    body = {"model": "fast", "from": "tiny", "draft": "tiny2", "stream": False}
    assert await post(jp_fetch, "api/create", body) == {"status": "success"}
    shown = await post(jp_fetch, "api/show", {"model": "fast"})
    blob = ModelStore(models_dir).get("tiny").model_path
    assert shown["modelfile"].endswith(f"\n\nFROM {blob}\nDRAFT {blob}\n")  # after its head
    assert shown["details"]["draft"] == {
        "model": "tiny2:latest",
        "digest": "sha256:" + blob.name[7:],
    }
    assert "draft" not in (await post(jp_fetch, "api/show", {"model": "tiny"}))["details"]


async def test_a_model_with_a_draft_drafts_with_it_through_the_server(jp_fetch, installed_model):
    """The whole path: the store's draft reaches the runner (LoadParams.draft),
    which drafts with it; the answer is the plain model's, the final chunk
    counts the drafts, and /api/ps's size holds the draft's memory too."""
    body = {"model": "fast", "from": "tiny", "draft": "tiny2", "stream": False}
    assert await post(jp_fetch, "api/create", body) == {"status": "success"}
    ask = {"prompt": "def f(x):", "stream": False}
    greedy = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 48}
    off = {**greedy, "draft_num_predict": 0}
    plain = await post(jp_fetch, "api/generate", {**ask, "model": "tiny", "options": off})
    fast = await post(jp_fetch, "api/generate", {**ask, "model": "fast", "options": greedy})
    assert fast["response"] == plain["response"] and fast["eval_count"] == 48
    # a model drafting for itself: its drafts are the target's own picks
    assert fast["draft_tokens"] > 10 and fast["draft_accepted"] >= 0.9 * fast["draft_tokens"]
    listed = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    ps = {m["name"]: m for m in listed}
    assert ps["fast:latest"]["size"] > ps["tiny:latest"]["size"]  # the draft's weights and cache
    # llama.cpp's own buffers, as the runner measured them: the draft's weights were loaded
    weights = {
        name: sum(a["weights"] for a in m["allocations"] if a["measured"]) for name, m in ps.items()
    }
    assert weights["tiny:latest"] > 0
    assert weights["fast:latest"] >= 1.9 * weights["tiny:latest"]  # itself, twice


async def test_create_with_an_uploaded_draft(jp_fetch, installed_model, models_dir, draft_gguf):
    data = draft_gguf.read_bytes()
    digest = ModelStore(models_dir).add_blob_from_file(draft_gguf)
    body = {"model": "fast", "from": "tiny", "draft": digest}
    await jp_fetch("llm", "api", "create", method="POST", body=json.dumps(body))
    entry = ModelStore(models_dir).get("fast")
    assert entry.draft_path is not None and entry.draft_path.read_bytes() == data
    shown = await post(jp_fetch, "api/show", {"model": "fast"})
    assert shown["details"]["draft"] == {"model": "", "digest": digest}


@pytest.mark.parametrize(
    ("draft", "match"),
    [
        (["tiny2"], "draft must be a string"),
        ({"a.gguf": "sha256:" + "0" * 64}, "draft must be a string"),
        ("", "draft is required and must be a non-empty string"),
        ("x" * 400, "longer than 350 characters"),
        ("../x", "invalid model name"),
        ("nope", "not found"),
        ("sha256:" + "1" * 64, "has not been uploaded"),
    ],
)
async def test_bad_drafts_are_400s(jp_fetch, installed_model, draft, match):
    body = {"model": "x", "from": "tiny", "draft": draft}
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, "api/create", body)
    assert info.value.code in (400, 404)
    assert match in json.loads(info.value.response.body)["error"]
    tags = await jp_fetch("llm", "api", "tags")
    assert "x:latest" not in [m["name"] for m in json.loads(tags.body)["models"]]


async def test_another_vocabulary_is_a_400(jp_fetch, installed_model, models_dir, tmp_path):
    other = write_demo_model(tmp_path / "o.gguf", DemoModelSpec(n_layer=1, extra_tokens=("zz",)))
    same = write_demo_model(tmp_path / "s.gguf", DemoModelSpec(n_layer=1, extra_tokens=("yy",)))
    store = ModelStore(models_dir)
    store.create("other", {"o.gguf": store.add_blob_from_file(other)})
    body = {"model": "x", "from": "other", "draft": store.add_blob_from_file(same)}
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, "api/create", body)
    assert info.value.code == 400
    error = json.loads(info.value.response.body)["error"]
    assert "does not share other:latest's vocabulary (token texts differ" in error


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("draft-models")
    ModelStore(models).create("tiny", {"t.gguf": ModelStore(models).add_blob_from_file(demo_gguf)})
    server = LiveServer(models, models)
    server.models = models
    yield server
    server.stop()


def test_a_modelfile_draft_file_is_uploaded(live, tmp_path, demo_gguf, draft_gguf):
    endpoint = ServerEndpoint(live.url, live.token, "env")
    (tmp_path / "small.gguf").write_bytes(draft_gguf.read_bytes())
    statuses = []
    create_from_modelfile(
        endpoint, "fast", "FROM tiny\nDRAFT ./small.gguf\n", tmp_path, statuses.append
    )
    assert statuses[-1] == "success"
    store = ModelStore(live.models)
    entry = store.get("fast")
    assert entry.draft_path is not None and entry.draft_path.read_bytes() == draft_gguf.read_bytes()
    manifest = json.loads(store.manifest_path(entry.name).read_text())
    assert [la["mediaType"] for la in manifest["layers"]].count(MEDIA_DRAFT) == 1
    # a draft named by model goes as its name
    create_from_modelfile(endpoint, "fast2", "FROM tiny\nDRAFT fast\n", tmp_path, statuses.append)
    assert store.get("fast2").draft_from == "fast:latest"
    with pytest.raises(LLMClientError, match=r"DRAFT \./none\.gguf: no such file"):
        create_from_modelfile(endpoint, "x", "FROM tiny\nDRAFT ./none.gguf\n", tmp_path)
