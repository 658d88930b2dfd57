"""Request priorities through a real Jupyter server and runners on the
generated model: ``priority`` in every generation API's body, the
``X-LLM-Priority`` header, their 400s in each API's own error shape, and
``/api/ps`` showing a running request's priority."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from endless import FOREVER
from tornado.httpclient import HTTPClientError
from waiting import until

from jupyter_llm.request.priority import HEADER, parse_priority, resolve

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
CHAT = [{"role": "user", "content": "hi"}]

# each generation route: a small body, and how its error body carries the message
ROUTES: dict[str, tuple[dict[str, Any], Any]] = {
    "api/generate": ({"prompt": "hi", "stream": False, "options": {"num_predict": 2}}, "ollama"),
    "api/chat": ({"messages": CHAT, "stream": False, "options": {"num_predict": 2}}, "ollama"),
    "v1/chat/completions": ({"messages": CHAT, "max_tokens": 2}, "openai"),
    "v1/completions": ({"prompt": "hi", "max_tokens": 2}, "openai"),
    "v1/responses": ({"input": "hi", "max_output_tokens": 16}, "openai"),
    "v1/messages": ({"messages": CHAT, "max_tokens": 2}, "anthropic"),
}


def message_of(shape: str, body: dict[str, Any]) -> str:
    """The error message, asserting the API's own error shape."""
    if shape == "ollama":
        assert isinstance(body["error"], str)
        return body["error"]
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("batch", "batch"), ("interactive", "interactive")],
)
def test_parse_priority(value, expected):
    assert parse_priority(value) == expected


@pytest.mark.parametrize("value", ["Batch", "low", "", 1, True, ["batch"], "b" * 10_000])
def test_unknown_priorities_are_refused_with_a_short_message(value):
    with pytest.raises(ValueError, match='priority must be "interactive" or "batch"') as info:
        parse_priority(value)
    assert len(str(info.value)) < 200  # never the whole value echoed


@pytest.mark.parametrize(
    ("body", "header", "expected"),
    [
        (None, None, "interactive"),  # the default
        (None, "batch", "batch"),
        (None, " batch ", "batch"),
        (None, "", "interactive"),
        ("interactive", "batch", "interactive"),  # the body wins
        ("batch", None, "batch"),
    ],
)
def test_resolve(body, header, expected):
    assert resolve(body, header) == expected


def test_a_bad_header_names_the_header():
    with pytest.raises(ValueError, match=HEADER):
        resolve(None, "later")


async def call(jp_fetch, route: str, body: dict[str, Any], headers: dict[str, str] | None = None):
    return await jp_fetch(
        "llm", *route.split("/"), method="POST", body=json.dumps(body), headers=headers or {}
    )


@pytest.mark.parametrize("route", list(ROUTES))
async def test_each_api_takes_priority_in_its_body_and_the_header(jp_fetch, installed_model, route):
    base, shape = ROUTES[route]
    body = {**base, "model": "tiny"}
    for extra, headers in [({"priority": "batch"}, None), ({}, {HEADER: "batch"})]:
        response = await call(jp_fetch, route, {**body, **extra}, headers)
        assert response.code == 200
    for extra, headers, named in [
        ({"priority": "urgent"}, None, "priority"),
        ({"priority": 3}, None, "priority"),
        ({}, {HEADER: "urgent"}, HEADER),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await call(jp_fetch, route, {**body, **extra}, headers)
        assert info.value.code == 400
        message = message_of(shape, json.loads(info.value.response.body))
        assert named in message and '"interactive" or "batch"' in message, message


async def test_ps_shows_a_running_requests_priority(
    jp_fetch, endless_model, jp_serverapp, http_server_port, jp_base_url
):
    """A streaming request sent with the header shows as batch in /api/ps
    while it runs, and no longer once it ended."""
    token = jp_serverapp.identity_provider.token
    body = json.dumps(
        {"model": "endless", "prompt": "go", "options": {**GREEDY, "num_predict": FOREVER}}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write(
        f"POST {jp_base_url}llm/api/generate HTTP/1.1\r\nHost: 127.0.0.1:{http_server_port[1]}\r\n"
        f"Authorization: token {token}\r\n{HEADER}: batch\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b'"done": false'), 30)  # streaming has started

    async def priorities() -> dict[str, Any]:
        models = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
        return models[0]["priorities"]

    assert await priorities() == {
        "interactive": {"running": 0, "queued": 0},
        "batch": {"running": 1, "queued": 0},
    }
    writer.close()

    async def ended() -> bool:
        return (await priorities())["batch"]["running"] == 0

    await until(ended, 30, "the batch request's release")
