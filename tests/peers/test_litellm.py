"""litellm's ``ollama/`` (``/api/generate``), ``ollama_chat/`` (``/api/chat``)
and ``openai/`` (``/v1``) providers: completion, streaming, a forced tool
call, a JSON schema, embeddings. litellm reads its model table from the
package, never from the internet (``LITELLM_LOCAL_MODEL_COST_MAP``)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Peer

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")
litellm = pytest.importorskip("litellm")
from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER  # noqa: E402
from litellm.litellm_core_utils.thread_pool_executor import executor  # noqa: E402

# litellm's own types, built as it first uses them
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")

ASK = [{"role": "user", "content": "Hello"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", autouse=True)
def _litellm_settles() -> Iterator[None]:
    """litellm logs each call's success from a pool of threads; they finish
    before the module does (a thread still importing and compiling at the
    session's end trips CPython 3.11's AST recursion check)."""
    yield
    executor.shutdown(wait=True)


def _where(peer: Peer, provider: str) -> dict[str, Any]:
    if provider == "openai":
        return {"api_base": peer.openai, "api_key": peer.token}
    # the Ollama providers send the key as a bearer token, as a proxy in front
    # of Ollama would take it; the Jupyter server takes it too
    return {"api_base": peer.ollama, "api_key": peer.token}


CHAT = ["ollama", "ollama_chat", "openai"]


def _finish(provider: str, reason: str) -> str:
    """litellm's ``ollama/`` provider reports every finish as "stop", whatever
    ``done_reason`` said (its own mapping, not what the server sent)."""
    return "stop" if provider == "ollama" else reason


@pytest.mark.parametrize("provider", CHAT)
def test_completion(peer: Peer, provider: str) -> None:
    r = litellm.completion(
        model=f"{provider}/tiny",
        messages=ASK,
        max_tokens=8,
        temperature=0,
        **_where(peer, provider),
    )
    choice = r.choices[0]
    assert choice.message.content and choice.finish_reason == _finish(provider, "length")
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
    assert r.model.endswith("tiny") or r.model.endswith("tiny:latest")


@pytest.mark.parametrize("provider", CHAT)
def test_stream(peer: Peer, provider: str) -> None:
    whole = litellm.completion(
        model=f"{provider}/tiny",
        messages=ASK,
        max_tokens=8,
        temperature=0,
        **_where(peer, provider),
    )
    chunks = list(
        litellm.completion(
            model=f"{provider}/tiny",
            messages=ASK,
            max_tokens=8,
            temperature=0,
            stream=True,
            **_where(peer, provider),
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [_finish(provider, "length")]


@pytest.mark.parametrize("provider", ["ollama_chat", "openai"])
def test_a_tool_call(peer: Peer, provider: str) -> None:
    """A call within a normal client's budget: it closes, and comes back as a
    call (never as markup in the content). ``openai/`` forces it
    (``tool_choice: "required"``); ``ollama_chat/`` drops ``tool_choice``
    (Ollama's API has none), so there the model that opens a call of its own
    accord answers."""
    model = "qwen" if provider == "openai" else "eager-qwen"
    r = litellm.completion(
        model=f"{provider}/{model}",
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
        **_where(peer, provider),
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and len(args["city"]) <= 12


@pytest.mark.parametrize("provider", ["ollama_chat", "openai"])
def test_a_json_schema(peer: Peer, provider: str) -> None:
    import jsonschema

    r = litellm.completion(
        model=f"{provider}/tiny",
        messages=[{"role": "user", "content": "A person, as JSON"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
        max_tokens=200,
        temperature=0,
        **_where(peer, provider),
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_embedding(peer: Peer, provider: str) -> None:
    r = litellm.embedding(model=f"{provider}/tiny", input=["a", "b"], **_where(peer, provider))
    vectors = [d["embedding"] for d in r.data]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
    assert vectors[0] != vectors[1]
    assert r.usage.prompt_tokens > 0


async def test_async_calls(peer: Peer) -> None:
    """``acompletion`` and ``aembedding`` on every provider, in one test: litellm
    keeps its async clients and logging tasks on the loop of its first async
    call, and each test here runs in a loop of its own, so they all finish in
    this one before it closes."""
    for provider in CHAT:
        r = await litellm.acompletion(
            model=f"{provider}/tiny",
            messages=ASK,
            max_tokens=4,
            temperature=0,
            **_where(peer, provider),
        )
        assert r.choices[0].message.content
    for provider in ("ollama", "openai"):
        e = await litellm.aembedding(
            model=f"{provider}/tiny", input=["a"], **_where(peer, provider)
        )
        assert len(e.data) == 1 and e.data[0]["embedding"]
    await GLOBAL_LOGGING_WORKER.flush()
    await GLOBAL_LOGGING_WORKER.stop()
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=10)
