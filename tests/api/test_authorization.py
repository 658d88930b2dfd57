"""Authorization, not only authentication: every route asks the server's
``Authorizer`` for one (action, resource) pair, so a deployment can let users
chat but not pull or delete. The table below is the one in the README; the
routes come from the app itself, so a new route must be added to it."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from jupyter_server.auth import Authorizer
from routes import routes
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

LLM, MODELS = "llm", "llm.models"
READ, WRITE, EXECUTE = "read", "write", "execute"
BLOB = "api/blobs/sha256:" + "0" * 64
MODEL = "v1/models/sha256:" + "0" * 64  # the route table's placeholder
RESPONSE = "v1/responses/sha256:" + "0" * 64

EXPECTED = {
    **{
        (path, method): (READ, LLM)
        for path in (
            "api/version",
            "api/devices",
            "api/tags",
            "api/ps",
            "api/usage",
            "api/history",
            "v1/models",
            MODEL,
        )
        for method in ("GET", "HEAD")
    },
    ("api/show", "POST"): (READ, LLM),
    ("api/plan", "POST"): (READ, LLM),
    ("api/generate", "POST"): (EXECUTE, LLM),
    ("api/chat", "POST"): (EXECUTE, LLM),
    ("api/embed", "POST"): (EXECUTE, LLM),
    ("api/embeddings", "POST"): (EXECUTE, LLM),
    ("v1/chat/completions", "POST"): (EXECUTE, LLM),
    ("v1/completions", "POST"): (EXECUTE, LLM),
    ("v1/embeddings", "POST"): (EXECUTE, LLM),
    ("v1/responses", "POST"): (EXECUTE, LLM),
    (RESPONSE, "GET"): (READ, LLM),
    (RESPONSE, "DELETE"): (EXECUTE, LLM),
    ("v1/messages", "POST"): (EXECUTE, LLM),
    ("v1/messages/count_tokens", "POST"): (EXECUTE, LLM),
    (BLOB, "HEAD"): (READ, MODELS),
    (BLOB, "POST"): (WRITE, MODELS),
    ("api/create", "POST"): (WRITE, MODELS),
    ("api/pull", "POST"): (WRITE, MODELS),
    ("api/copy", "POST"): (WRITE, MODELS),
    ("api/delete", "DELETE"): (WRITE, MODELS),
}


class RecordingAuthorizer(Authorizer):
    """Refuses the (action, resource) pairs in ``refused``; records every ask."""

    refused: ClassVar[set[tuple[str, str]]] = set()
    asked: ClassVar[list[tuple[str, str, str, str]]] = []

    def is_authorized(self, handler, user, action, resource) -> bool:
        path = handler.request.path.split("/llm/", 1)[-1]
        self.asked.append((path, handler.request.method, action, resource))
        return (action, resource) not in self.refused


@pytest.fixture
def jp_server_config(jp_server_config):
    RecordingAuthorizer.refused = set()
    RecordingAuthorizer.asked = []
    return {
        **jp_server_config,
        "ServerApp": {**jp_server_config["ServerApp"], "authorizer_class": RecordingAuthorizer},
    }


async def fetch(serverapp, base_url, port, path, method, body=b"{}"):
    client = AsyncHTTPClient(force_instance=True)
    return await client.fetch(
        f"http://127.0.0.1:{port}{base_url}llm/{path}",
        method=method,
        headers={"Authorization": f"token {serverapp.identity_provider.token}"},
        body=body if method in ("POST", "DELETE") else None,
        allow_nonstandard_methods=True,
        request_timeout=30,
    )


def test_the_table_covers_every_route():
    assert set(routes()) == set(EXPECTED)


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_the_catch_all_asks_nothing(
    jp_serverapp, jp_base_url, http_server, http_server_port, method
):
    """Not in the table: an unknown path reads nothing there is to authorize,
    so a user refused everything still learns the path is wrong."""
    RecordingAuthorizer.refused = {(a, r) for a in (READ, WRITE, EXECUTE) for r in (LLM, MODELS)}
    with pytest.raises(HTTPClientError) as info:
        await fetch(jp_serverapp, jp_base_url, http_server_port[1], "v1/assistants", method)
    assert info.value.code == 404
    assert RecordingAuthorizer.asked == []


@pytest.mark.parametrize(("path", "method"), sorted(EXPECTED))
async def test_every_route_asks_for_its_action_and_resource(
    jp_serverapp, jp_base_url, http_server, http_server_port, path, method
):
    RecordingAuthorizer.refused = {(a, r) for a in (READ, WRITE, EXECUTE) for r in (LLM, MODELS)}
    with pytest.raises(HTTPClientError) as info:
        await fetch(jp_serverapp, jp_base_url, http_server_port[1], path, method)
    assert info.value.code == 403
    assert RecordingAuthorizer.asked == [(path, method, *EXPECTED[path, method])]


async def test_refused_model_writes_leave_chat_working(
    jp_serverapp, jp_base_url, http_server, http_server_port, installed_model, monkeypatch
):
    RecordingAuthorizer.refused = {(WRITE, MODELS)}
    store = jp_serverapp.web_app.settings["jupyter_llm"].store
    writers = []
    real_writer = store.blob_writer
    monkeypatch.setattr(store, "blob_writer", lambda: writers.append(1) or real_writer())
    port = http_server_port[1]
    refused = [
        ("api/pull", "POST", json.dumps({"model": "example.invalid/x"}).encode()),
        ("api/delete", "DELETE", json.dumps({"model": "tiny"}).encode()),
        ("api/copy", "POST", json.dumps({"source": "tiny", "destination": "t2"}).encode()),
        ("api/create", "POST", json.dumps({"model": "t3", "from": "tiny"}).encode()),
        (BLOB, "POST", b"\0" * (1 << 20)),
    ]
    for path, method, body in refused:
        with pytest.raises(HTTPClientError) as info:
            await fetch(jp_serverapp, jp_base_url, port, path, method, body)
        assert info.value.code == 403, path
        assert (
            "not authorized to write on resource: llm.models" in info.value.response.body.decode()
        )
    assert writers == []  # the upload was refused before a byte went to disk
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "options": {"num_predict": 2},
    }
    r = await fetch(jp_serverapp, jp_base_url, port, "api/chat", "POST", json.dumps(chat).encode())
    assert json.loads(r.body)["done"] is True
    tags = json.loads((await fetch(jp_serverapp, jp_base_url, port, "api/tags", "GET")).body)
    assert sorted(m["name"] for m in tags["models"]) == [
        "tiny2:latest",
        "tiny3:latest",
        "tiny:latest",
    ]
