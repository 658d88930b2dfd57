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
    for chunk in chunks:  # a token's text and its log-probability in one chunk, as Ollama's
        if chunk.get("logprobs"):
            assert chunk["response"] == "".join(e["token"] for e in chunk["logprobs"])
        else:
            assert chunk["response"] == ""
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
    chunks = [chunk async for chunk in stream if chunk.choices]
    streamed = [
        c.model_dump()
        for chunk in chunks
        if chunk.choices[0].logprobs
        for c in chunk.choices[0].logprobs.content
    ]
    for chunk in chunks:  # a token's text and its log-probability in one chunk
        lp, text = chunk.choices[0].logprobs, chunk.choices[0].delta.content
        assert (text or "") == "".join(c.token for c in (lp.content or [] if lp else []))
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


# -- whole_logprobs: what an answer held until its end may hold ----------------------------------
@pytest.mark.parametrize(
    "whole, top, num_predict, expected, shift",
    [
        (True, 2, None, 10, True),  # until a stop: ends at the bound
        (True, 2, -1, 10, True),
        (True, 2, -2, 10, False),  # fill the context: still no shift
        (True, 2, 50, 10, True),
        (True, 2, 10, 10, True),  # within: as asked
        (True, 2, 4, 4, True),
        (True, 0, 29, 29, True),  # no alternatives: a token is one entry
        (True, 0, 31, 30, True),
        (True, None, 50, 50, True),  # no logprobs: nothing held per token
        (False, 20, -1, -1, True),  # streamed: nothing held
    ],
)
def test_a_whole_answer_with_logprobs_ends_at_its_bound(
    monkeypatch, whole, top, num_predict, expected, shift
):
    from jupyter_llm.api.generation import GenerationRequest, held_whole
    from jupyter_llm.models.names import parse_model_name
    from jupyter_llm.request import limits

    monkeypatch.setattr(limits, "WHOLE_LOGPROBS", limits.Limit("w", "w", 30, "entries", "w"))
    options = {"temperature": 0} if num_predict is None else {"num_predict": num_predict}
    job = GenerationRequest(parse_model_name("m"), logprobs=top, whole=whole)
    held, bounded = held_whole(job, options)
    assert bounded.get("num_predict", -1) == expected and held.shift is shift
    assert bounded["temperature" if num_predict is None else "num_predict"] is not None


async def test_a_whole_answer_with_logprobs_ends_with_length(jp_fetch, endless_model, monkeypatch):
    """A model that never stops: held whole, the answer ends at the bound
    (30 entries: 10 tokens of 1 + 2); streamed, or without logprobs, it
    runs to its num_predict."""
    from jupyter_llm.request import limits

    monkeypatch.setattr(limits, "WHOLE_LOGPROBS", limits.Limit("w", "w", 30, "entries", "w"))
    body = {"model": endless_model, "prompt": "go on", "logprobs": True, "top_logprobs": 2}
    [whole] = await post(jp_fetch, "api/generate", {**body, "stream": False, "options": GREEDY})
    assert whole["done_reason"] == "length" and whole["eval_count"] == 10
    check_entries(whole["logprobs"], 10, 2)
    chunks = await post(
        jp_fetch, "api/generate", {**body, "options": {**GREEDY, "num_predict": 15}}
    )
    assert chunks[-1]["eval_count"] == 15
    assert len([e for c in chunks for e in c.get("logprobs", [])]) == 15
    plain = {"model": endless_model, "prompt": "go on", "stream": False}
    [free] = await post(jp_fetch, "api/generate", {**plain, "options": {"num_predict": 15}})
    assert free["eval_count"] == 15
