"""``LLMHandler.stream`` on its own: handlers mounted for the test stream
made-up values, so every case (an error before or after the first byte, a
client that leaves) is driven without a model."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

import pytest
from tornado import web
from tornado.httpclient import HTTPClientError
from waiting import until

from jupyter_llm.api import base
from jupyter_llm.api.base import NDJSON, SSE, LLMHandler
from jupyter_llm.api.generation import Finished
from jupyter_llm.api.openai import OpenAIHandler
from jupyter_llm.request.errors import ModelNotFound, RunnerFailed

closed = asyncio.Event()  # set when a stream's source is closed


async def source(kind: str):
    try:
        if kind == "early":
            raise ModelNotFound("nope:latest")
        yield [{"n": 1}, {"n": 2}]
        if kind == "late":
            raise RunnerFailed("runner process was killed by SIGKILL")
        if kind == "bug":
            raise ZeroDivisionError
        if kind == "endless":
            n = 3
            while True:
                await asyncio.sleep(0.01)
                yield [{"n": n}]
                n += 1
    finally:
        closed.set()


class OllamaStream(LLMHandler):
    @web.authenticated
    async def post(self, kind: str) -> None:
        await self.stream(source(kind), NDJSON)


class OpenAIStream(OpenAIHandler):
    @web.authenticated
    async def post(self, kind: str) -> None:
        await self.stream(source(kind), SSE)


@pytest.fixture
def mounted(jp_serverapp, jp_base_url):
    closed.clear()
    jp_serverapp.web_app.add_handlers(
        ".*$",
        [
            (f"{jp_base_url}test-stream/ollama/(\\w+)", OllamaStream),
            (f"{jp_base_url}test-stream/openai/(\\w+)", OpenAIStream),
        ],
    )


async def fetch(jp_fetch, flavour, kind):
    return await jp_fetch("test-stream", flavour, kind, method="POST", body="{}")


def sse(body: bytes) -> list:
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


async def test_ndjson_values_then_finish(jp_fetch, mounted):
    r = await fetch(jp_fetch, "ollama", "ok")
    assert r.headers["Content-Type"] == "application/x-ndjson"
    assert r.body == b'{"n": 1}\n{"n": 2}\n'
    assert closed.is_set()


async def test_sse_values_then_done(jp_fetch, mounted):
    r = await fetch(jp_fetch, "openai", "ok")
    assert r.headers["Content-Type"] == "text/event-stream"
    assert r.headers["Cache-Control"] == "no-cache"
    assert sse(r.body) == [{"n": 1}, {"n": 2}, "[DONE]"]


@pytest.mark.parametrize(
    ("flavour", "error"),
    [
        ("ollama", "model 'nope:latest' not found"),
        (
            "openai",
            {
                "message": "model 'nope:latest' not found",
                "type": "not_found_error",
                "param": None,
                "code": None,
            },
        ),
    ],
)
async def test_error_before_the_first_byte_is_a_plain_error(jp_fetch, mounted, flavour, error):
    with pytest.raises(HTTPClientError) as info:
        await fetch(jp_fetch, flavour, "early")
    assert info.value.code == 404
    assert info.value.response.headers["Content-Type"] == "application/json"
    assert json.loads(info.value.response.body) == {"error": error}


async def test_error_after_the_first_byte_ends_the_stream(jp_fetch, mounted):
    r = await fetch(jp_fetch, "ollama", "late")
    lines = [json.loads(x) for x in r.body.decode().splitlines()]
    assert lines == [{"n": 1}, {"n": 2}, {"error": "runner process was killed by SIGKILL"}]

    events = sse((await fetch(jp_fetch, "openai", "late")).body)
    assert events[:2] == [{"n": 1}, {"n": 2}] and events[-1] == "[DONE]"
    assert events[2]["error"]["message"] == "runner process was killed by SIGKILL"
    assert events[2]["error"]["type"] == "api_error"


async def test_a_bug_after_the_first_byte_names_no_traceback(jp_fetch, mounted):
    r = await fetch(jp_fetch, "ollama", "bug")
    assert r.body.decode().splitlines()[-1] == '{"error": "internal error: ZeroDivisionError"}'


async def test_a_client_that_leaves_closes_the_source(
    jp_serverapp, jp_base_url, http_server, http_server_port, mounted
):
    token = jp_serverapp.identity_provider.token
    reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write(
        f"POST {jp_base_url}test-stream/ollama/endless HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{http_server_port[1]}\r\n"
        f"Authorization: token {token}\r\nContent-Length: 2\r\n\r\n{{}}".encode()
    )
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b'{"n": 3}'), 30)  # streaming has started
    assert not closed.is_set()
    writer.close()
    await asyncio.wait_for(closed.wait(), 30)


# -- with a model: a client that leaves before a whole answer is written -----------


@pytest.fixture
def recorded(monkeypatch):
    """How each generation of the handlers ended: "finished" or "cancelled"."""
    outcomes: list[str] = []
    real = base.complete

    async def recording(services, job, requester):
        seen = False
        try:
            async with aclosing(real(services, job, requester)) as events:
                async for batch in events:
                    seen = seen or any(isinstance(e, Finished) for e in batch)
                    yield batch
        finally:
            outcomes.append("finished" if seen else "cancelled")

    monkeypatch.setattr(base, "complete", recording)
    return outcomes


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("api/generate", {"prompt": "go", "stream": False, "options": {"num_predict": -1}}),
        ("v1/chat/completions", {"messages": [{"role": "user", "content": "go"}]}),
        ("v1/completions", {"prompt": "go"}),
    ],
)
async def test_a_client_that_leaves_a_whole_answer_cancels_it(
    jp_fetch,
    jp_serverapp,
    jp_base_url,
    http_server_port,
    endless_model,
    recorded,
    path,
    body,
):
    # an answer far longer than it takes to notice a closed connection
    await jp_fetch("llm", "api", "generate", method="POST", body='{"model": "endless"}')  # load
    loaded = jp_serverapp.web_app.settings["jupyter_llm"].scheduler.loaded_models()[0]
    data = json.dumps({"model": endless_model, **body}).encode()
    token = jp_serverapp.identity_provider.token
    __reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write(
        f"POST {jp_base_url}llm/{path} HTTP/1.1\r\nHost: 127.0.0.1:{http_server_port[1]}\r\n"
        f"Authorization: token {token}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    await until(lambda: loaded.refcount, 30, "the generation to start")
    writer.close()
    await until(lambda: recorded, 60, "the cancel to be recorded")
    assert recorded == ["cancelled"]

    async def released() -> bool:
        return not loaded.refcount and not (await loaded.runner.process.call("health"))["busy"]

    await until(released, 30, "the runner to be released and stop generating")
