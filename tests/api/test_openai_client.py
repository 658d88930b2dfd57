"""Conformance with the official ``openai`` client against the running server."""

import base64
import json
import struct

import openai
import pytest


@pytest.fixture
def client(openai_client):
    return openai_client


async def test_chat_completions(client, installed_model):
    r = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        seed=3,
    )
    assert r.object == "chat.completion" and r.model == "tiny"  # as written
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens > 6

    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


async def test_usage_counts_the_prompt_tokens_the_cache_held(client, installed_model):
    messages = [{"role": "user", "content": "the same question, asked twice over"}]
    first = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    again = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    held = again.usage.prompt_tokens_details.cached_tokens
    # the whole prompt but its last token, which is decoded again for its logits
    assert held == again.usage.prompt_tokens - 1 > first.usage.prompt_tokens_details.cached_tokens
    answer = await client.responses.create(model="tiny", input=messages, max_output_tokens=2)
    assert answer.usage.input_tokens_details.cached_tokens == answer.usage.input_tokens - 1


async def test_chat_stop_and_content_parts(client, installed_model):
    full = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        max_tokens=30,
        temperature=0,
    )
    text = full.choices[0].message.content
    stopped = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=30,
        temperature=0,
        stop=[text[4:7]],
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert text.startswith(stopped.choices[0].message.content)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer"},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 4}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


async def test_response_format_json_schema_and_object(client, installed_model):
    import jsonschema

    r = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a person"}],
        max_tokens=200,
        temperature=0.7,
        seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    )
    assert r.choices[0].finish_reason == "stop"
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, SCHEMA)
    assert list(value) == ["name", "age", "tags"]  # property order preserved

    r = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "json"}],
        max_tokens=400,
        temperature=0.7,
        seed=2,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # the budget ran out mid-object: it is at least a JSON object's beginning
        assert r.choices[0].message.content.lstrip().startswith("{")


async def test_completions(client, installed_model):
    r = await client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens == 5
    stream = await client.completions.create(
        model="tiny", prompt="hello", max_tokens=5, temperature=0, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream]) == r.choices[0].text


async def test_embeddings_float_and_base64(client, installed_model):
    r = await client.embeddings.create(model="tiny", input=["hello", "world"])
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == 64
    assert abs(sum(v * v for v in r.data[0].embedding) - 1) < 1e-4  # normalised
    raw = await client.embeddings.with_raw_response.create(
        model="tiny", input="hello", encoding_format="base64"
    )
    b64 = json.loads(raw.http_response.text)["data"][0]["embedding"]
    decoded = struct.unpack("<64f", base64.b64decode(b64))
    assert max(abs(a - b) for a, b in zip(decoded, r.data[0].embedding, strict=True)) < 1e-6
    short = await client.embeddings.create(model="tiny", input="hello", dimensions=8)
    assert len(short.data[0].embedding) == 8


async def test_models(client, installed_model):
    models = await client.models.list()
    assert "tiny:latest" in [m.id for m in models.data]
    m = await client.models.retrieve("tiny:latest")
    assert m.id == "tiny:latest" and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")


async def test_errors_in_openai_shape(client, installed_model):
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]
        )
    assert "model 'nope:latest' not found" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny", messages=[], max_tokens=1)
    assert "messages" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert "invalid format" in info.value.message
