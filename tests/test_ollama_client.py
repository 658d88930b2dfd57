"""End to end with the official ``ollama`` Python client against the running server."""

import ollama
import pytest

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture
def client(jp_serverapp, jp_base_url, http_server, http_server_port, jp_auth_header):
    host = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm"
    return ollama.AsyncClient(host=host, headers=jp_auth_header)


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
