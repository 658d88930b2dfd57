"""Every route the app mounts refuses requests without a valid token, except
the root heartbeat, which answers everyone and tells nothing. The list comes
from the app itself, so a new route cannot be forgotten."""

import pytest
from routes import CATCH_ALL, METHODS, PUBLIC, routes
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_llm.api import handlers


def test_every_handler_is_listed():
    paths = {p for p, _ in routes()}
    for expected in (
        "api/generate",
        "api/chat",
        "api/embed",
        "api/show",
        "api/delete",
        "v1/chat/completions",
        "v1/models",
    ):
        assert expected in paths


@pytest.mark.parametrize(("path", "method"), routes())
@pytest.mark.parametrize("auth", [None, "token wrong", "Bearer wrong"])
async def test_refused_without_valid_token(
    jp_base_url, http_server, http_server_port, path, method, auth
):
    client = AsyncHTTPClient(force_instance=True)
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/{path}"
    headers = {"Authorization": auth} if auth else {}
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None
    with pytest.raises(HTTPClientError) as info:
        await client.fetch(
            url,
            method=method,
            headers=headers,
            body=body,
            allow_nonstandard_methods=True,
            request_timeout=10,
        )
    # OpenAI's and Anthropic's routes answer as they do: 401 (authentication_error,
    # invalid_api_key); Ollama's, as jupyter_server does, 403
    assert info.value.code == (401 if path.startswith("v1/") else 403)


@pytest.mark.parametrize("path", ["v1/assistants", "api/nothing", "nothing", "api/chat/"])
@pytest.mark.parametrize("method", [m.upper() for m in METHODS])
@pytest.mark.parametrize("auth", [None, "token wrong", "Bearer wrong"])
async def test_the_catch_all_refuses_without_valid_token(
    jp_base_url, http_server, http_server_port, path, method, auth
):
    """An unknown path is refused without a token, as a known one is (a 401
    under v1/): the catch-all tells nobody which paths exist."""
    await test_refused_without_valid_token(
        jp_base_url, http_server, http_server_port, path, method, auth
    )


def test_every_route_names_its_authorization_resource():
    from jupyter_llm.api.base import LLMHandler

    assert not hasattr(LLMHandler, "auth_resource")  # each route chooses, none inherits it
    for pattern, handler in handlers():
        if handler not in PUBLIC | CATCH_ALL:  # the catch-all reads nothing to authorize
            assert getattr(handler, "auth_resource", None) in ("llm", "llm.models"), pattern


def test_the_public_routes_are_the_heartbeat_only():
    assert routes(public=True) == [("", "GET"), ("", "HEAD")]


@pytest.mark.parametrize("slash", ["", "/"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("auth", [None, "token wrong"])
async def test_the_root_answers_like_ollama_without_a_token(
    jp_base_url, http_server, http_server_port, slash, method, auth
):
    client = AsyncHTTPClient(force_instance=True)
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm{slash}"
    r = await client.fetch(
        url, method=method, headers={"Authorization": auth} if auth else {}, request_timeout=10
    )
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert r.headers["Content-Length"] == str(len("Ollama is running"))
    assert r.body == (b"Ollama is running" if method == "GET" else b"")


async def test_the_root_does_not_count_as_activity(
    jp_serverapp, jp_base_url, http_server, http_server_port
):
    """A client polling the heartbeat must not keep an idle server from culling."""
    settings = jp_serverapp.web_app.settings
    settings.pop("api_last_activity", None)
    client = AsyncHTTPClient(force_instance=True)
    token = jp_serverapp.identity_provider.token
    r = await client.fetch(
        f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/",
        headers={"Authorization": f"token {token}"},
        request_timeout=10,
    )
    assert r.code == 200
    assert "api_last_activity" not in settings
    await client.fetch(
        f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/version",
        headers={"Authorization": f"token {token}"},
        request_timeout=10,
    )
    assert "api_last_activity" in settings  # the check above can fail
