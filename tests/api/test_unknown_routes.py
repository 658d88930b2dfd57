"""Every answer under ``{base_url}llm/`` is its API's JSON, errors included,
so that a client reports what went wrong instead of choking on an HTML page:

- a path no route takes is a 404 naming it, in OpenAI's
  shape under ``v1/`` and Ollama's elsewhere, on a forwarding server too,
  where it is answered locally and never forwarded;
- a route called with a method it lacks is a 405 naming the ones it has;
- a request without a valid token is a 403 that says how to send one,
  instead of jupyter_server's ``'_xsrf' argument missing from POST``.
"""

from __future__ import annotations

import json
import socket

import httpx
import ollama
import openai
import pytest
from tornado.httpclient import AsyncHTTPClient

from jupyter_llm.api import handlers
from jupyter_llm.api.base import TOKEN_NEEDED

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")
OPENAI_UNKNOWN = (
    "v1/assistants",
    "v1/responses/resp_1/input_items",
    "v1/nothing",
    "v1",
    "v1/chat/completions/",
)
OLLAMA_UNKNOWN = ("api/nothing", "api/chat/", "api/tags/", "nothing/at/all", "api/blobs/x/y")
README_SECTION = "Using it over HTTP"


async def call(port, base_url, path, method="GET", token=None, headers=None, body=b"{}"):
    """A raw request (no client library in the way), never raising on a status."""
    client = AsyncHTTPClient(force_instance=True)
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"token {token}"
    return await client.fetch(
        f"http://127.0.0.1:{port}{base_url}llm/{path}",
        method=method,
        headers=headers,
        body=body if method in ("POST", "PUT", "PATCH", "DELETE") else None,
        allow_nonstandard_methods=True,
        follow_redirects=False,
        raise_error=False,
        request_timeout=30,
    )


def openai_shaped(body: bytes, type_: str | None = None, code: str | None = None) -> str:
    """The message of an OpenAI error body, after checking its shape."""
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] is None and error["code"] == code
    if type_:
        assert error["type"] == type_
    return error["message"]


def ollama_shaped(body: bytes) -> str:
    value = json.loads(body)
    assert set(value) == {"error"} and isinstance(value["error"], str)
    return value["error"]


def test_the_catch_all_is_the_last_route():
    """Tornado takes the first route that matches: any later one would be dead."""
    assert handlers()[-1][0] == "(?P<path>.+)"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", OPENAI_UNKNOWN + OLLAMA_UNKNOWN)
async def test_an_unknown_path_is_a_json_404_in_its_apis_shape(
    jp_serverapp, jp_base_url, http_server, http_server_port, path, method
):
    token = jp_serverapp.identity_provider.token
    r = await call(http_server_port[1], jp_base_url, path, method, token)
    assert r.code == 404
    assert r.headers["Content-Type"] == "application/json"
    if method == "HEAD":
        assert r.body == b""
        return
    if path.startswith("v1"):
        message = openai_shaped(r.body, "invalid_request_error")
    else:
        message = ollama_shaped(r.body)
    assert f"{jp_base_url}llm/{path} is not a route this server has" in message
    if path.endswith("/"):
        assert "no trailing '/'" in message


async def test_a_path_with_a_percent_sign_is_quoted_back_as_sent(
    jp_serverapp, jp_base_url, http_server, http_server_port
):
    token = jp_serverapp.identity_provider.token
    r = await call(http_server_port[1], jp_base_url, "api/%25s%25d%25%25", "GET", token)
    assert r.code == 404
    assert ollama_shaped(r.body).startswith(f"{jp_base_url}llm/api/%25s%25d%25%25 is not")


async def test_a_long_unknown_path_is_not_echoed_whole(
    jp_serverapp, jp_base_url, http_server, http_server_port
):
    token = jp_serverapp.identity_provider.token
    r = await call(http_server_port[1], jp_base_url, "api/" + "x" * 5000, "GET", token)
    assert r.code == 404
    assert len(ollama_shaped(r.body)) < 500


async def test_an_unknown_openai_route_through_the_openai_client(openai_client):
    with pytest.raises(openai.NotFoundError) as info:
        await openai_client.files.list()
    assert info.value.status_code == 404
    assert info.value.type == "invalid_request_error"
    assert "is not a route this server has" in info.value.message


@pytest.mark.parametrize(
    ("path", "method", "allowed", "openai_api"),
    [
        ("api/chat", "GET", "POST", False),
        ("api/chat", "PUT", "POST", False),
        ("api/tags", "POST", "GET, HEAD", False),
        ("api/delete", "POST", "DELETE", False),
        ("v1/models", "POST", "GET, HEAD", True),
        ("v1/chat/completions", "GET", "POST", True),
        ("v1/chat/completions", "PATCH", "POST", True),
        ("v1/responses", "GET", "POST", True),
    ],
)
async def test_a_method_the_route_lacks_is_a_json_405(
    jp_serverapp, jp_base_url, http_server, http_server_port, path, method, allowed, openai_api
):
    token = jp_serverapp.identity_provider.token
    r = await call(http_server_port[1], jp_base_url, path, method, token)
    assert r.code == 405
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["Allow"] == allowed
    message = openai_shaped(r.body) if openai_api else ollama_shaped(r.body)
    assert message == f"{method} is not a method of {jp_base_url}llm/{path}; it answers {allowed}"


# -- no token ------------------------------------------------------------------------------
@pytest.mark.parametrize("auth", [None, "token wrong", "Bearer wrong"])
@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("api/chat", "POST"),  # was "'_xsrf' argument missing from POST"
        ("api/tags", "GET"),  # was "Forbidden"
        ("api/delete", "DELETE"),
        ("v1/chat/completions", "POST"),
        ("v1/models", "GET"),
        ("v1/assistants", "POST"),  # an unknown path needs the token too
        ("api/nothing", "GET"),
        ("api/chat", "PUT"),  # a method the route lacks: who asks is checked first
    ],
)
async def test_no_valid_token_is_a_403_that_says_how_to_send_one(
    jp_base_url, http_server, http_server_port, path, method, auth
):
    headers = {"Authorization": auth} if auth else {}
    r = await call(http_server_port[1], jp_base_url, path, method, headers=headers)
    assert r.headers["Content-Type"] == "application/json"
    if path.startswith("v1/"):  # OpenAI's 401: the client's AuthenticationError
        assert r.code == 401
        message = openai_shaped(r.body, "invalid_request_error", "invalid_api_key")
    else:
        assert r.code == 403  # what jupyter_server answers an API request without identity
        message = ollama_shaped(r.body)
    assert message == TOKEN_NEEDED
    for how in ("Authorization: token <token>", "Bearer <token>", "?token=<token>"):
        assert how in message
    assert README_SECTION in message


def test_the_message_points_at_a_readme_section_that_exists():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert f"\n## {README_SECTION}\n" in readme
    assert TOKEN_NEEDED.split(":")[0] in readme  # Troubleshooting quotes it


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_tokenless_probe_gets_the_403_without_a_body(
    jp_base_url, http_server, http_server_port, method
):
    r = await call(http_server_port[1], jp_base_url, "api/tags", method)
    assert r.code == 403
    if method == "HEAD":
        assert r.body == b""


@pytest.mark.parametrize("how", ["query", "bearer"])
async def test_the_ways_the_message_gives_work_for_a_post(
    jp_serverapp, jp_base_url, http_server, http_server_port, how
):
    token = jp_serverapp.identity_provider.token
    path, headers = "api/show", {}
    if how == "query":
        path += f"?token={token}"
    else:
        headers["Authorization"] = f"Bearer {token}"
    body = json.dumps({"model": "missing"}).encode()
    r = await call(http_server_port[1], jp_base_url, path, "POST", headers=headers, body=body)
    assert r.code == 404  # past the token: the model is unknown
    assert "missing" in ollama_shaped(r.body)


async def test_a_browser_session_keeps_jupyter_servers_xsrf_check(
    jp_serverapp, jp_base_url, http_server, http_server_port
):
    """A login cookie without the ``_xsrf`` token is a cross-site request to
    refuse as jupyter_server does, not a client that forgot its token."""
    token = jp_serverapp.identity_provider.token
    r = await call(http_server_port[1], jp_base_url, "api/tags", "GET", token)
    cookies = [c.split(";")[0] for c in r.headers.get_list("Set-Cookie")]
    login = [c for c in cookies if c.startswith("username-")]
    assert login, cookies
    r = await call(
        http_server_port[1], jp_base_url, "api/show", "POST", headers={"Cookie": login[0]}
    )
    assert r.code == 403
    assert "_xsrf" in ollama_shaped(r.body)


@pytest.fixture
def tokenless_ollama_client(jp_serverapp, jp_base_url, http_server, http_server_port):
    """The official ``ollama`` client as a user who forgot the token."""
    return ollama.AsyncClient(host=f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm")


async def test_the_ollama_client_without_a_token_reads_how_to_send_one(tokenless_ollama_client):
    for request in (
        tokenless_ollama_client.chat("tiny", messages=[{"role": "user", "content": "hi"}]),
        tokenless_ollama_client.list(),
    ):
        with pytest.raises(ollama.ResponseError) as info:
            await request
        assert info.value.status_code == 403
        assert info.value.error == TOKEN_NEEDED


async def test_the_openai_client_without_a_valid_token_reads_how_to_send_one(
    jp_base_url, http_server, http_server_port
):
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/v1", api_key="wrong"
    )
    for request in (
        client.models.list(),
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}]),
    ):
        with pytest.raises(openai.AuthenticationError) as info:
            await request
        assert info.value.body["message"] == TOKEN_NEEDED
        assert info.value.body["code"] == "invalid_api_key"


class TestJupyterServersDefault:
    """Under jupyter_server's default ``allow_unauthenticated_access = True``
    (the test config sets False), it is the routes' own checks that refuse."""

    @pytest.fixture
    def jp_server_config(self, jp_server_config):
        server = {**jp_server_config["ServerApp"], "allow_unauthenticated_access": True}
        return {**jp_server_config, "ServerApp": server}

    @pytest.mark.parametrize(
        ("path", "method"),
        [
            ("api/chat", "POST"),
            ("api/tags", "GET"),
            ("api/tags", "HEAD"),
            ("v1/assistants", "GET"),
            ("v1/responses", "POST"),
            ("api/nothing", "HEAD"),
        ],
    )
    async def test_no_token_is_the_same_403(
        self, jp_base_url, http_server, http_server_port, path, method
    ):
        r = await call(http_server_port[1], jp_base_url, path, method)
        assert r.code == (401 if path.startswith("v1/") else 403)
        if method == "HEAD":
            return
        if path.startswith("v1/"):
            assert openai_shaped(r.body, code="invalid_api_key") == TOKEN_NEEDED
        else:
            assert ollama_shaped(r.body) == TOKEN_NEEDED

    async def test_the_heartbeat_stays_public(self, jp_base_url, http_server, http_server_port):
        r = await call(http_server_port[1], jp_base_url, "")
        assert r.code == 200


# -- a forwarding server ---------------------------------------------------------------------
def _closed_port() -> int:
    """A port nothing listens on: a request forwarded there fails with a 502."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestForwardingServer:
    """Pointed at an engine that is down: a forwarded request is a 502, so a
    404 or a 405 proves it was answered here."""

    @pytest.fixture
    def llm_config(self, monkeypatch) -> dict:
        monkeypatch.setenv("JUPYTER_LLM_ENGINE_TOKEN", "engine-token")
        return {"engine_url": f"http://127.0.0.1:{_closed_port()}/llm/"}

    @pytest.fixture
    def here(self, jp_serverapp, jp_base_url, http_server, http_server_port):
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/",
            headers={"Authorization": f"token {jp_serverapp.identity_provider.token}"},
            timeout=30,
        )

    async def test_a_known_route_is_forwarded(self, here):
        async with here:
            r = await here.get("api/tags")
        assert r.status_code == 502  # the engine is down: it was sent there

    @pytest.mark.parametrize("path", ["v1/assistants", "api/nothing", "api/chat/"])
    async def test_an_unknown_path_is_answered_here(self, here, path):
        async with here:
            r = await here.post(path, json={"model": "tiny", "input": "hi"})
        assert r.status_code == 404
        if path.startswith("v1/"):
            message = openai_shaped(r.content, "invalid_request_error")
        else:
            message = ollama_shaped(r.content)
        assert "is not a route this server has" in message

    async def test_a_method_the_route_lacks_is_a_405_here(self, here, jp_base_url):
        async with here:
            r = await here.put("v1/chat/completions", json={})
        assert r.status_code == 405
        assert r.headers["Allow"] == "POST"
        message = openai_shaped(r.content)
        assert (
            message
            == f"PUT is not a method of {jp_base_url}llm/v1/chat/completions; it answers POST"
        )

    async def test_no_token_is_the_same_403_here(self, here):
        async with here:
            del here.headers["Authorization"]
            r = await here.post("api/chat", json={})
        assert r.status_code == 403
        assert ollama_shaped(r.content) == TOKEN_NEEDED
