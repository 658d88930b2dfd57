"""A pydantic-ai agent with a tool and a structured output type, on our
``/v1`` through pydantic-ai's own OpenAI-compatible providers.

The random-weight model never chooses to call, so the agent forces each step
(``tool_choice`` per step, as pydantic-ai allows through a callable's
settings): first the tool, then the output. Every string in the schemas is
bounded, so the grammar closes it within the budget, and what the agent
returns is validated by pydantic-ai itself.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from conftest import Peer
from pydantic import BaseModel, Field
from pydantic_ai import Agent, NativeOutput, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.ollama import OllamaProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

MAX_TOKENS = 200


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


def _model(peer: Peer, provider: str) -> OpenAIChatModel:
    if provider == "ollama":  # pydantic-ai's Ollama provider speaks /v1 too
        chosen = OllamaProvider(base_url=peer.openai, api_key=peer.token)
    else:
        chosen = OpenAIProvider(base_url=peer.openai, api_key=peer.token)
    return OpenAIChatModel("qwen", provider=chosen)


def _settings(ctx: RunContext[None]) -> ModelSettings:
    """The tool on the first step, the output after it."""
    first = ctx.run_step <= 1
    return ModelSettings(
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=1,
        tool_choice=["get_weather"] if first else "none",
    )


def _agent(peer: Peer, provider: str, calls: list[str]) -> Agent[None, Forecast]:
    agent = Agent(
        _model(peer, provider),
        output_type=Forecast,
        model_settings=_settings,
        instructions="Answer with a forecast.",
    )

    @agent.tool_plain
    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    return agent


@pytest.mark.parametrize("provider", ["openai", "ollama"])
async def test_an_agent_calls_its_tool_then_returns_its_output_type(
    peer: Peer, provider: str
) -> None:
    calls: list[str] = []
    result = await _agent(peer, provider, calls).run(
        "What is the weather in Oslo for three days?",
        usage_limits=UsageLimits(request_limit=3),
    )
    assert isinstance(result.output, Forecast)
    assert len(calls) == 1 and len(calls[0]) <= 12
    usage = result.usage
    assert usage.requests == 2 and usage.input_tokens > 0 and usage.output_tokens > 0
    # the history as pydantic-ai keeps it: request, call, result, output call, ...
    kinds = [part.part_kind for message in result.all_messages() for part in message.parts]
    assert kinds.count("tool-call") == 2 and "tool-return" in kinds


async def test_an_agent_streams_its_output(peer: Peer) -> None:
    calls: list[str] = []
    agent = _agent(peer, "openai", calls)
    async with agent.run_stream(
        "What is the weather in Oslo?", usage_limits=UsageLimits(request_limit=3)
    ) as stream:
        outputs = [output async for output in stream.stream_output(debounce_by=None)]
    assert outputs and isinstance(outputs[-1], Forecast)
    assert len(calls) == 1


async def test_native_output_is_response_format(peer: Peer) -> None:
    """``NativeOutput``: the schema goes as ``response_format`` (json_schema)."""
    agent = Agent(
        _model(peer, "openai"),
        output_type=NativeOutput(Forecast),
        model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0, seed=1),
    )
    result = await agent.run("A forecast, please.")
    assert isinstance(result.output, Forecast)
    assert len(result.output.city) <= 12
