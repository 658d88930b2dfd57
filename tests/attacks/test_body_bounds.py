"""Attack 8 and the body bounds: nesting, lone surrogates and the number of
values are 400s naming their limit, on both APIs; and a body at the size
limit, made of millions of tiny values, is decoded without freezing the
server for other users."""

from __future__ import annotations

import asyncio
import json

import pytest
from harness import MAX_SLOWDOWN, slowdown

from jupyter_llm.request.limits import BODY_BYTES, BODY_DEPTH, JSON_VALUES
from jupyter_llm.request.untrusted_json import FAST_VALUES, BodyError, parse_json_object

LONE = '"\\ud800"'  # a lone surrogate, as a client's JSON encoder writes it


def nested(depth: int, leaf: str = "1") -> str:
    return '{"a": ' * depth + leaf + "}" * depth


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"x": ' + LONE + "}", "x holds a lone UTF-16 surrogate"),
        ('{"m": [{"content": "ok"}, {"content": "a\\udfffb"}]}', r"m\[1\].content holds a lone"),
        ('{"\\udc00": 1}', "a key of request body holds a lone"),
        (nested(BODY_DEPTH.value + 1), "json_depth"),
        ("[" * 3000 + "]" * 3000, "json_depth"),
        (
            '{"x": [' + ",".join(["1"] * (JSON_VALUES.value + 1)) + "]}",
            "has more than the limit is|json_values",
        ),
    ],
    ids=["surrogate", "surrogate in a list", "surrogate key", "depth+1", "depth 3000", "values"],
)
def test_bodies_beyond_a_bound_are_refused_naming_it(raw, message):
    with pytest.raises(BodyError, match=message):
        parse_json_object(raw.encode())


@pytest.mark.parametrize(
    "raw",
    [
        '{"x": "\\ud83d\\ude00"}',  # a surrogate pair is one character: fine
        nested(BODY_DEPTH.value - 1),
        '{"x": [' + ",".join(["1.5"] * (FAST_VALUES + 10)) + "]}",  # the counting path
        '{"x": [' + ",".join(['{"a": [true, null, "s", -2e3]}'] * (FAST_VALUES // 4)) + "]}",
    ],
    ids=["pair", "depth-1", "many numbers", "many objects"],
)
def test_bodies_within_the_bounds_decode_as_json_does(raw):
    assert parse_json_object(raw.encode()) == json.loads(raw)


def test_the_counting_path_refuses_nan_like_the_fast_one():
    raw = '{"x": [' + ",".join(["1"] * FAST_VALUES) + '], "t": NaN}'
    with pytest.raises(BodyError, match="t: NaN is not a JSON number"):
        parse_json_object(raw.encode())


def test_a_body_that_is_not_utf8_is_refused():
    with pytest.raises(BodyError, match="not UTF-8"):
        parse_json_object(b'{"prompt": "\xff"}')


ROUTES = [
    ("api/generate", lambda s: {"model": "tiny", "prompt": s}),
    ("api/chat", lambda s: {"model": "tiny", "messages": [{"role": "user", "content": s}]}),
    (
        "v1/chat/completions",
        lambda s: {"model": "tiny", "messages": [{"role": "user", "content": s}]},
    ),
    ("v1/completions", lambda s: {"model": "tiny", "prompt": s}),
    ("api/embed", lambda s: {"model": "tiny", "input": [s]}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[p for p, _ in ROUTES])
async def test_a_lone_surrogate_is_a_400_on_every_api(users, installed_model, path, body):
    attacker, _ = users
    raw = json.dumps(body("\ud800"))  # json.dumps writes it as \ud800
    assert "\\ud800" in raw
    status, answer = await attacker.json(path, raw.encode())
    assert status == 400, answer
    assert "lone UTF-16 surrogate" in json.dumps(answer), answer


async def test_tool_arguments_nested_3000_deep_are_a_400(users, installed_model):
    attacker, _ = users
    arguments = nested(3000)
    for path, arguments_value in (("api/chat", arguments), ("v1/chat/completions", None)):
        call = {
            "function": {
                "name": "f",
                # Ollama sends an object, OpenAI a JSON string holding one
                "arguments": json.loads("{}") if arguments_value is None else None,
            }
        }
        raw = json.dumps(
            {
                "model": "tiny",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                ],
            }
        )
        if arguments_value is not None:  # the object itself, nested in the body
            raw = raw.replace('"arguments": null', '"arguments": ' + arguments_value)
        else:  # a JSON string whose text nests 3000 deep
            raw = raw.replace('"arguments": {}', '"arguments": ' + json.dumps(arguments))
        status, answer = await attacker.json(path, raw.encode())
        assert status == 400, (path, answer)
        assert "json_depth" in json.dumps(answer) or "schema_depth" in json.dumps(answer), answer


def many_values_body() -> bytes:
    """A body just under the size limit that is all tiny values: the slowest
    to decode that the server accepts to read."""
    count = (BODY_BYTES.value - 100) // 2
    return b'{"model": "tiny", "context": [' + b"0," * (count - 1) + b"0]}"


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
async def test_a_body_of_tiny_values_at_the_size_limit_leaves_tags_answering(
    users, installed_model
):
    attacker, victim = users
    body = many_values_body()
    assert len(body) <= BODY_BYTES.value

    async def attack(running: asyncio.Event) -> tuple[int, object]:
        running.set()  # the server reads and decodes it as soon as it arrives
        return await attacker.json("api/generate", body)

    measured, (status, answer) = await slowdown(lambda: victim.fetch("api/tags"), attack)
    assert status == 400, answer
    assert "json_values" in json.dumps(answer), answer
    assert measured.ratio <= MAX_SLOWDOWN, measured


async def test_bodies_one_user_holds_are_bounded_and_given_back(
    jp_serverapp, jp_fetch, jp_base_url, http_server_port, installed_model
):
    """A body held (here: an upload stopped short of its end, as a queued
    prompt is held until it runs) counts against its user's bodies_held; a
    request past it is a 429 that names the limit, and the share comes back
    when the held request ends."""
    from tornado.httpclient import HTTPClientError
    from waiting import until

    from jupyter_llm.api.base import HELD_BODIES
    from jupyter_llm.request.held_bodies import HeldBodies

    held = jp_serverapp.web_app.settings[HELD_BODIES] = HeldBodies(limit=200_000)
    token = jp_serverapp.identity_provider.token
    _, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write(
        f"POST {jp_base_url}llm/api/show HTTP/1.1\r\nHost: 127.0.0.1:{http_server_port[1]}\r\n"
        f"Authorization: token {token}\r\nContent-Length: 300000\r\n\r\n".encode()
        + b" " * 150_000  # the rest never comes
    )
    await writer.drain()
    await until(lambda: held.held.get("local", 0) >= 150_000, 30, "the stalled body to be held")
    body = json.dumps({"model": "tiny", "pad": "x" * 100_000})
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("llm", "api", "show", method="POST", body=body)
    assert refused.value.code == 429
    assert "(bodies_held)" in json.loads(refused.value.response.body)["error"]
    assert held.held.get("local", 0) >= 150_000  # the refused one gave back what it took
    writer.close()  # the stalled client leaves: its share comes back
    await until(lambda: not held.held, 30, "the stalled body's share to be given back")
    shown = await jp_fetch("llm", "api", "show", method="POST", body=body)
    assert json.loads(shown.body)["details"]["format"] == "gguf"
    assert not held.held  # every ended request gave its share back


async def test_a_request_running_after_its_client_left_keeps_its_share(
    jp_serverapp, jp_base_url, http_server, http_server_port, installed_model, monkeypatch
):
    """A request whose client left after sending its body runs on (an embed
    queued behind a busy model does not watch its client): its body stays
    held, so its share is given back when it ends, not when the client left."""
    from raw_http import open_post
    from waiting import until

    from jupyter_llm.api import ollama
    from jupyter_llm.api.base import HELD_BODIES, LLMHandler
    from jupyter_llm.request.held_bodies import HeldBodies

    held = jp_serverapp.web_app.settings[HELD_BODIES] = HeldBodies()
    started, release, closed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    real_embed, real_close = ollama.embed, LLMHandler.on_connection_close

    async def queued_embed(*args, **kwargs):  # waits as an embed behind a busy model
        started.set()
        await release.wait()
        return await real_embed(*args, **kwargs)

    def on_connection_close(self):
        real_close(self)
        closed.set()

    monkeypatch.setattr(ollama, "embed", queued_embed)
    monkeypatch.setattr(LLMHandler, "on_connection_close", on_connection_close)
    token = jp_serverapp.identity_provider.token
    body = {"model": "tiny", "input": "x" * 100_000}
    _, writer = await open_post(http_server_port[1], jp_base_url, token, "api/embed", body)
    await asyncio.wait_for(started.wait(), 30)
    writer.close()  # the client leaves while its request waits
    await asyncio.wait_for(closed.wait(), 30)
    assert held.held == {"local": len(json.dumps(body))}  # its body is still held
    release.set()
    await until(lambda: not held.held, 30, "the ended request to give its share back")
