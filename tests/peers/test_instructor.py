"""instructor in ``Mode.TOOLS`` (a forced call to the response model's
function) and ``Mode.JSON_SCHEMA`` (``response_format`` with the model's
schema), through the official ``openai`` client pointed at our ``/v1``.

instructor validates what comes back with the response model; one attempt
only (``max_retries=1``), so a bad answer fails instead of being retried.
Every string is bounded so that a random-weight model's string closes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

import instructor
import openai
import pytest
from conftest import Peer
from pydantic import BaseModel, Field

MODES = [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA]
ASK = [{"role": "user", "content": "Extract: Ada Lovelace, 36, mathematician."}]
OPTIONS = {"max_tokens": 200, "temperature": 0, "seed": 1, "max_retries": 1}


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=150)
    role: Literal["mathematician", "poet", "engineer"]
    tags: list[Annotated[str, Field(max_length=8)]] = Field(max_length=2)


@pytest.fixture
def sync_client(peer: Peer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=peer.openai, api_key=peer.token, max_retries=0)
    yield client
    client.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_response_model(sync_client: openai.OpenAI, mode: instructor.Mode) -> None:
    client = instructor.from_openai(sync_client, mode=mode)
    person, completion = client.chat.completions.create_with_completion(
        model="qwen", response_model=Person, messages=ASK, **OPTIONS
    )
    assert isinstance(person, Person)
    choice = completion.choices[0]
    if mode is instructor.Mode.TOOLS:
        assert choice.finish_reason == "tool_calls" and choice.message.content in (None, "")
        assert choice.message.tool_calls[0].function.name == "Person"
    else:
        assert choice.finish_reason == "stop" and Person.model_validate_json(choice.message.content)
    assert completion.usage.completion_tokens > 0


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_partial_stream(sync_client: openai.OpenAI, mode: instructor.Mode) -> None:
    """``create_partial``: the stream's growing object, the last one whole.
    (A tool call's arguments come in one delta, as Ollama sends a call, so in
    TOOLS mode the first partial is the whole object.)"""
    client = instructor.from_openai(sync_client, mode=mode)
    partials = list(
        client.chat.completions.create_partial(
            model="qwen", response_model=Person, messages=ASK, **OPTIONS
        )
    )
    assert partials if mode is instructor.Mode.TOOLS else len(partials) > 1
    Person.model_validate(partials[-1].model_dump())


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
async def test_async(peer: Peer, mode: instructor.Mode) -> None:
    raw = openai.AsyncOpenAI(base_url=peer.openai, api_key=peer.token, max_retries=0)
    client = instructor.from_openai(raw, mode=mode)
    try:
        person = await client.chat.completions.create(
            model="qwen", response_model=Person, messages=ASK, **OPTIONS
        )
    finally:
        await raw.close()
    assert isinstance(person, Person)
