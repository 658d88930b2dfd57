"""A server pointed at a shared engine (``JUPYTER_LLM_ENGINE_URL``) starts no
scheduler and forwards every route there (``api.forward``): authorized here
first, the same question per route; streams pass through as they come and a
client that leaves cancels the generation in the engine; the engine's status
codes and error bodies arrive unchanged; an engine that is down is a 502.

The engine is a real Jupyter server with jupyter-llm (``LiveServer``); the
forwarding one is the test's own ``jp_serverapp``."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import httpx
import psutil
import pytest
from live_server import LiveServer
from test_authorization import EXPECTED, RecordingAuthorizer, fetch
from tornado.httpclient import HTTPClientError
from waiting import until

from jupyter_llm.config import Settings
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.request.priority import HEADER
from jupyter_llm.services import LLMServices

LONG_CTX = 1 << 16  # a greedy generation of the demo model cannot end before it is left
ENDLESS = {"num_predict": -1, "num_ctx": LONG_CTX, "temperature": 0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("engine-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    long = write_demo_model(
        tmp_path_factory.mktemp("long") / "long.gguf", DemoModelSpec(context_length=LONG_CTX)
    )
    store.create("long", {"long.gguf": store.add_blob_from_file(long)})
    env = {"JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("engine-runtime"))}
    server = LiveServer(models, models, env)
    yield server
    server.stop()


@pytest.fixture
def engine_url(engine) -> str:
    return f"{engine.url}llm/"


@pytest.fixture
def llm_config(engine_url, engine, monkeypatch) -> dict:
    monkeypatch.setenv("JUPYTER_LLM_ENGINE_TOKEN", engine.token)
    return {"engine_url": engine_url}


@pytest.fixture
def jp_server_config(jp_server_config):
    RecordingAuthorizer.refused = set()
    RecordingAuthorizer.asked = []
    return {
        **jp_server_config,
        "ServerApp": {**jp_server_config["ServerApp"], "authorizer_class": RecordingAuthorizer},
    }


@pytest.fixture
def here(jp_serverapp, jp_base_url, http_server, http_server_port) -> httpx.AsyncClient:
    """A client of the forwarding server's ``llm/`` routes."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/",
        headers={"Authorization": f"token {jp_serverapp.identity_provider.token}"},
        timeout=60,
    )


async def holders(engine: LiveServer) -> list[dict]:
    async with httpx.AsyncClient(base_url=f"{engine.url}llm/", headers=_auth(engine)) as c:
        models = (await c.get("api/ps")).json()["models"]
    return [u for m in models for u in m["users"]]


def _auth(engine: LiveServer) -> dict[str, str]:
    return {"Authorization": f"token {engine.token}"}


@pytest.mark.parametrize(("path", "method"), sorted(EXPECTED))
async def test_each_route_is_authorized_here_as_the_engine_would(
    jp_serverapp, jp_base_url, http_server, http_server_port, path, method
):
    RecordingAuthorizer.refused = set(EXPECTED.values())
    with pytest.raises(HTTPClientError) as info:
        await fetch(jp_serverapp, jp_base_url, http_server_port[1], path, method)
    assert info.value.code == 403
    assert RecordingAuthorizer.asked == [(path, method, *EXPECTED[path, method])]


async def test_no_scheduler_here_and_the_engine_answers(jp_serverapp, here, engine):
    settings = jp_serverapp.web_app.settings
    assert not isinstance(settings["jupyter_llm"], LLMServices)  # the extension app's own entry
    assert settings["jupyter_llm"].services is None  # no scheduler, no runner
    async with here:
        assert (await here.get("")).text == "Ollama is running"  # the heartbeat, here
        mine = (await here.get("api/devices")).json()
        tags = (await here.get("api/tags")).json()
        head = await here.head("api/ps")
    theirs = engine.client.get("api/devices").json()
    assert [d["id"] for d in mine["devices"]] == [d["id"] for d in theirs["devices"]]
    assert {m["name"] for m in tags["models"]} == {"tiny:latest", "long:latest"}
    assert head.status_code == 200 and head.content == b""


async def test_a_stream_passes_through_and_leaving_cancels_it_in_the_engine(here, engine):
    body = {"model": "long", "prompt": "go on forever", "options": ENDLESS}
    async with here:
        async with here.stream("POST", "api/generate", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/x-ndjson"
            lines = r.aiter_lines()
            first = json.loads(await anext(lines))
            assert first["done"] is False and first["model"] == "long"
            assert await holders(engine) == [{"name": "local", "running": 1, "queued": 0}]
            await anext(lines)  # it goes on streaming, while the generation runs
        # the client left: the forwarded connection closes and the engine stops

        async def released() -> bool:
            return await holders(engine) == []

        await until(released)
        sse = {"model": "tiny", "stream": True, "max_tokens": 3, "messages": _hi()}
        r = await here.post("v1/chat/completions", json=sse)
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert r.text.endswith("data: [DONE]\n\n")


def _hi() -> list[dict]:
    return [{"role": "user", "content": "hi"}]


async def test_the_priority_header_reaches_the_engine(here, engine):
    """Sent on through the forwarding server, the engine's scheduler reads it
    (an unknown value: the engine's 400 names the header)."""
    body = {"model": "tiny", "stream": False, "max_tokens": 2, "messages": _hi()}
    async with here:
        bad = await here.post("v1/chat/completions", json=body, headers={HEADER: "urgent"})
        good = await here.post("v1/chat/completions", json=body, headers={HEADER: "batch"})
    assert bad.status_code == 400 and HEADER in bad.json()["error"]["message"]
    assert good.status_code == 200


async def test_the_kernel_and_cell_reach_the_engines_usage(here, engine):
    """The origin headers are sent on: the engine counts the request under them."""
    origin = {"X-LLM-Kernel": "forwarded-kernel", "X-LLM-Cell": "c-7", "X-LLM-Execution-Count": "7"}
    body = {"model": "tiny", "stream": False, "max_tokens": 2, "messages": _hi()}
    async with here:
        answer = await here.post("v1/chat/completions", json=body, headers=origin)
    assert answer.status_code == 200
    async with httpx.AsyncClient(base_url=f"{engine.url}llm/", headers=_auth(engine)) as c:
        usage = (await c.get("api/usage", params={"kernel": "forwarded-kernel"})).json()
    assert [(r["cell"], r["execution_count"], r["requests"]) for r in usage["cells"]] == [
        ("c-7", 7, 1)
    ]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("api/chat", {"model": "missing", "messages": []}, 404),
        ("api/generate", {"model": "tiny", "prompt": "x", "options": {"top_k": "many"}}, 400),
        ("api/generate", {"model": "tiny", "format": "yaml", "prompt": "x"}, 400),
        ("v1/chat/completions", {"model": "missing", "messages": [{"role": "user"}]}, 404),
        ("v1/completions", {"model": "tiny", "prompt": "x", "temperature": 9}, 400),
        ("api/show", {"model": "../../etc/passwd"}, 400),
    ],
)
async def test_the_engines_errors_arrive_unchanged(here, engine, path, body, status):
    direct = engine.client.post(path, json=body)
    async with here:
        forwarded = await here.post(path, json=body)
    assert direct.status_code == status
    assert forwarded.status_code == status
    assert forwarded.headers["content-type"] == direct.headers["content-type"]
    assert forwarded.json() == direct.json()


async def test_uploads_and_deletes_go_to_the_engines_store(here, engine, demo_gguf: Path):
    data = demo_gguf.read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    async with here:
        r = await here.post(f"api/blobs/{digest}", content=data)
        assert r.status_code == 201, r.text
        assert (await here.head(f"api/blobs/{digest}")).status_code == 200
        r = await here.post("api/create", json={"model": "up", "files": {"t.gguf": digest}})
        assert r.status_code == 200 and r.text.splitlines()[-1] == '{"status": "success"}'
        assert "up:latest" in {m["name"] for m in engine.client.get("api/tags").json()["models"]}
        r = await here.request("DELETE", "api/delete", json={"model": "up"})
        assert r.status_code == 200
        bad = await here.post(f"api/blobs/sha256:{'0' * 64}", content=b"not it")
    assert "up:latest" not in {m["name"] for m in engine.client.get("api/tags").json()["models"]}
    assert bad.status_code == 400 and "digest" in bad.json()["error"]


class TestEngineDiesMidAnswer:
    @pytest.fixture
    def engine(self, tmp_path, demo_gguf):
        """An engine of this test's own, to kill."""
        store = ModelStore(tmp_path / "models")
        long = write_demo_model(tmp_path / "long.gguf", DemoModelSpec(context_length=LONG_CTX))
        store.create("long", {"long.gguf": store.add_blob_from_file(long)})
        server = LiveServer(tmp_path / "models", tmp_path, {"JUPYTER_RUNTIME_DIR": str(tmp_path)})
        yield server
        server.stop()

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("api/generate", {"model": "long", "prompt": "go", "options": ENDLESS}),
            (
                "v1/chat/completions",
                {"model": "long", "stream": True, "messages": _hi(), **{"max_tokens": 100000}},
            ),
        ],
    )
    async def test_the_stream_ends_with_an_error_in_its_apis_shape(self, here, engine, path, body):
        async with here:
            async with here.stream("POST", path, json=body) as r:
                assert r.status_code == 200
                lines = r.aiter_lines()
                assert (await anext(lines)).strip()  # the generation has begun
                runners = engine.runners()
                engine.proc.kill()  # the engine dies mid-answer (our own child)
                rest = [line async for line in lines if line.strip()]
        assert psutil.wait_procs(runners, timeout=30)[1] == []  # its runners end with it
        if path == "api/generate":
            error = json.loads(rest[-1])["error"]
        else:
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2].removeprefix("data: "))["error"]["message"]
        assert error.startswith("the jupyter-llm engine's answer broke off")


class TestEngineDown:
    @pytest.fixture
    def engine_url(self) -> str:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{s.getsockname()[1]}/services/llm/"

    async def test_a_502_in_each_apis_shape(self, here, engine_url):
        async with here:
            ollama = await here.get("api/tags")
            openai = await here.post("v1/chat/completions", json={"model": "m"})
        assert ollama.status_code == openai.status_code == 502
        assert ollama.json()["error"].startswith(
            f"cannot reach the jupyter-llm engine at {engine_url}"
        )
        assert openai.json()["error"]["message"].startswith("cannot reach the jupyter-llm engine")


@pytest.mark.parametrize(
    ("env", "url", "token"),
    [
        ({}, "", ""),
        ({"JUPYTER_LLM_ENGINE_URL": "http://h:1/services/llm"}, "http://h:1/services/llm/", ""),
        (
            {"JUPYTER_LLM_ENGINE_URL": "https://h/llm/", "JUPYTERHUB_API_TOKEN": "hub"},
            "https://h/llm/",
            "hub",
        ),
        (
            {
                "JUPYTER_LLM_ENGINE_URL": "http://h/",
                "JUPYTER_LLM_ENGINE_TOKEN": "mine",
                "JUPYTERHUB_API_TOKEN": "hub",
            },
            "http://h/",
            "mine",
        ),
        ({"JUPYTERHUB_API_TOKEN": "hub"}, "", ""),  # no engine: the Hub's token stays unused
    ],
)
def test_engine_settings(env, url, token):
    settings = Settings.from_env(env)
    assert (settings.engine_url, settings.engine_token) == (url, token)
    assert "hub" not in repr(settings) and "mine" not in repr(settings)


@pytest.mark.parametrize("url", ["127.0.0.1:8765", "ftp://h/", "http://"])
def test_a_bad_engine_url_names_the_variable(url):
    with pytest.raises(ConfigError, match="JUPYTER_LLM_ENGINE_URL"):
        Settings.from_env({"JUPYTER_LLM_ENGINE_URL": url})


async def test_the_anthropic_client_is_forwarded_with_its_x_api_key(
    jp_serverapp, jp_base_url, http_server, http_server_port, engine
):
    """x-api-key is read here as on the engine (the token of this server,
    never sent on), and a wrong one is Anthropic's 401 here too."""
    import anthropic

    base = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm"
    token = jp_serverapp.identity_provider.token
    client = anthropic.AsyncAnthropic(base_url=base, api_key=token, max_retries=0)
    r = await client.messages.create(model="tiny", max_tokens=3, messages=_hi())
    assert r.model == "tiny" and r.usage.output_tokens == 3
    wrong = anthropic.AsyncAnthropic(base_url=base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        await wrong.messages.count_tokens(model="tiny", messages=_hi())
    assert info.value.body["error"]["type"] == "authentication_error"
