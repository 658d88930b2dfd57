"""End to end with the official ``ollama`` Python client against the running server."""

import ollama
import pytest

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture
def client(ollama_client):
    return ollama_client


async def test_official_client_end_to_end(client, demo_gguf):
    version = await client._request_raw("GET", "/api/version")
    assert version.json()["version"]

    digest = await client.create_blob(demo_gguf)
    progress = [
        p async for p in await client.create("tiny", files={"tiny.gguf": digest}, stream=True)
    ]
    assert progress[-1].status == "success"

    listed = await client.list()
    assert [m.model for m in listed.models] == ["tiny:latest"]
    assert listed.models[0].details.family == "llama"

    parts = [
        p
        async for p in await client.generate(
            "tiny", "hello", stream=True, options={**GREEDY, "num_predict": 10}
        )
    ]
    assert parts[-1].done and parts[-1].eval_count == 10
    streamed = "".join(p.response for p in parts)

    whole = await client.generate("tiny", "hello", options={**GREEDY, "num_predict": 10})
    assert whole.response == streamed
    assert whole.done_reason == "length"

    chat = await client.chat(
        "tiny", messages=[{"role": "user", "content": "hi"}], options={**GREEDY, "num_predict": 5}
    )
    assert chat.message.role == "assistant" and chat.message.content
    chunks = [
        c
        async for c in await client.chat(
            "tiny",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            options={**GREEDY, "num_predict": 5},
        )
    ]
    assert "".join(c.message.content for c in chunks) == chat.message.content

    ps = await client.ps()
    assert [m.model for m in ps.models] == ["tiny:latest"]

    with pytest.raises(ollama.ResponseError) as info:
        await client.generate("nope", "x")
    assert info.value.status_code == 404
    assert "model 'nope:latest' not found" in info.value.error


async def test_official_client_admin_and_embeddings(client, demo_gguf, models_dir):
    digest = await client.create_blob(demo_gguf)
    await client.create("tiny", files={"tiny.gguf": digest})

    shown = await client.show("tiny")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert "completion" in shown.capabilities and "insert" in shown.capabilities
    assert "im_start" in shown.template and shown.details.family == "llama"

    await client.copy("tiny", "me/copy:v2")
    names = [m.model for m in (await client.list()).models]
    assert sorted(names) == ["me/copy:v2", "tiny:latest"]

    e = await client.embed("tiny", ["hello", "there"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 64
    assert abs(sum(v * v for v in e.embeddings[0]) - 1) < 1e-4
    e8 = await client.embed("tiny", "hello", dimensions=8)
    assert len(e8.embeddings[0]) == 8
    legacy = await client.embeddings("tiny", "hello")
    assert len(legacy.embedding) == 64

    await client.delete("me/copy:v2")
    assert [m.model for m in (await client.list()).models] == ["tiny:latest"]
    await client.delete("tiny")
    assert (await client.list()).models == []
    assert list((models_dir / "blobs").iterdir()) == []  # unreferenced blobs collected
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("tiny")
    assert info.value.status_code == 404


async def test_official_client_structured_output(client, demo_gguf):
    import json

    import jsonschema

    digest = await client.create_blob(demo_gguf)
    await client.create("tiny", files={"tiny.gguf": digest})
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
    }
    r = await client.chat(
        "tiny",
        messages=[{"role": "user", "content": "where?"}],
        format=schema,
        options={"seed": 5, "num_predict": 200},
    )
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content), schema)
    g = await client.generate(
        "tiny", "where?", format=schema, options={"seed": 6, "num_predict": 200}
    )
    jsonschema.validate(json.loads(g.response), schema)
