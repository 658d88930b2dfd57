"""logprobs and top_logprobs on both APIs, each in its own shape (issue 13)."""

import json
import math

import pytest
from tornado.httpclient import HTTPClientError

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


async def post(jp_fetch, path, body):
    r = await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return [json.loads(line) for line in r.body.decode().splitlines() if line.strip()]


def check_entries(entries, n, top):
    assert len(entries) == n
    for e in entries:
        assert e["logprob"] <= 0 and bytes(e["bytes"]).decode(errors="replace") == e["token"]
        alternatives = e["top_logprobs"]
        assert len(alternatives) == top
        values = [a["logprob"] for a in alternatives]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6
        if alternatives:  # greedy: the token chosen is the likeliest one
            assert alternatives[0]["token"] == e["token"]
            assert alternatives[0]["logprob"] == pytest.approx(e["logprob"])


def same(a, b):
    """Equal entries, up to float noise (a cached prefix changes the batch shape)."""
    assert [e["token"] for e in a] == [e["token"] for e in b]
    for x, y in zip(a, b, strict=True):
        assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-4)
        assert [t["token"] for t in x["top_logprobs"]] == [t["token"] for t in y["top_logprobs"]]


async def test_ollama_logprobs_streamed_and_whole(jp_fetch, installed_model):
    body = {
        "model": installed_model,
        "prompt": "hello",
        "logprobs": True,
        "top_logprobs": 3,
        "options": {**GREEDY, "num_predict": 6},
    }
    [whole] = await post(jp_fetch, "api/generate", {**body, "stream": False})
    check_entries(whole["logprobs"], 6, 3)
    assert "".join(e["token"] for e in whole["logprobs"]) == whole["response"]
    chunks = await post(jp_fetch, "api/generate", body)
    streamed = [e for c in chunks for e in c.get("logprobs", [])]
    same(streamed, whole["logprobs"])
    [chat] = await post(
        jp_fetch,
        "api/chat",
        {
            "model": installed_model,
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True,
            "stream": False,
            "options": {**GREEDY, "num_predict": 4},
        },
    )
    check_entries(chat["logprobs"], 4, 0)
    [plain] = await post(jp_fetch, "api/generate", {**body, "logprobs": False, "stream": False})
    assert "logprobs" not in plain


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"logprobs": "yes"}, "logprobs must be a boolean"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer between 0"),
    ],
)
async def test_bad_logprobs_are_400s(jp_fetch, installed_model, fields, message):
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, "api/generate", {"model": installed_model, "prompt": "x", **fields})
    assert info.value.code == 400 and message in json.loads(info.value.response.body)["error"]


@pytest.fixture
def client(openai_client):
    return openai_client


async def test_openai_chat_logprobs(client, installed_model):
    ask = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    r = await client.chat.completions.create(**ask)
    content = r.choices[0].logprobs.content
    check_entries([c.model_dump() for c in content], 5, 2)
    stream = await client.chat.completions.create(**ask, stream=True)
    streamed = [
        c.model_dump()
        async for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for c in chunk.choices[0].logprobs.content
    ]
    same(streamed, [c.model_dump() for c in content])
    plain = await client.chat.completions.create(**{**ask, "logprobs": False})
    assert plain.choices[0].logprobs is None


async def test_openai_completions_logprobs(client, installed_model):
    r = await client.completions.create(
        model="tiny", prompt="hello", max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in lp.top_logprobs)
