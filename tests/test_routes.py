"""Every route the app mounts refuses requests without a valid token. The list
comes from the app itself, so a new route cannot be forgotten."""

import re

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_llm.api import handlers

METHODS = ("get", "head", "post", "put", "delete", "patch")


def routes():
    out = []
    for pattern, handler in handlers():
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", "sha256:" + "0" * 64, pattern)
        for method in METHODS:
            if method in handler.__dict__ or any(
                method in base.__dict__
                for base in handler.__mro__[1:]
                if "jupyter_llm" in base.__module__
            ):
                out.append((path, method.upper()))
    return out


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
    assert info.value.code == 403


def test_every_route_names_its_authorization_resource():
    from jupyter_llm.api.base import LLMHandler

    assert not hasattr(LLMHandler, "auth_resource")  # each route chooses, none inherits it
    for pattern, handler in handlers():
        assert getattr(handler, "auth_resource", None) in ("llm", "llm.models"), pattern
