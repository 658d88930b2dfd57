"""openai-agents at its default model settings (it calls the Responses API
by default) against the running server, the Jupyter token as its API key:
an Agent with a function tool and one with a structured ``output_type``.
The demo model is random, so the tool is forced and the structure comes
from the grammar: what is tested is that the wire works with the SDK."""

from __future__ import annotations

import pydantic
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

set_tracing_disabled(True)  # traces go to OpenAI's servers; nothing leaves the test


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    days: int = pydantic.Field(ge=1, le=7)


@pytest.fixture
def qwen(models_dir, tmp_path_factory):
    """The demo model under Qwen 2.5's chat template (Hermes-style tool calls)."""
    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("agents-hermes")
    template = read_template("Qwen-Qwen2.5-7B-Instruct")
    path = write_demo_model(folder / "qwen.gguf", DemoModelSpec(chat_template=template))
    store.create("qwen", {"qwen.gguf": store.add_blob_from_file(path)})
    return "qwen"


@pytest.fixture
def model(openai_client, qwen):
    return OpenAIResponsesModel(model=qwen, openai_client=openai_client)


async def test_an_agent_calls_a_function_tool(model):
    asked: list[Weather] = []

    @function_tool
    def get_weather(city: str, days: int) -> str:
        """The weather in a city for some days."""
        asked.append(Weather.model_construct(city=city, days=days))
        return f"sunny in {city}"

    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=model,
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="get_weather"),
        tool_use_behavior="stop_on_first_tool",  # the forced call would otherwise repeat
    )
    result = await Runner.run(agent, "What is the weather in Oslo?", max_turns=2)
    assert len(asked) >= 1 and isinstance(asked[0].city, str)
    assert result.final_output == f"sunny in {asked[0].city}"
    (response,) = result.raw_responses
    assert response.usage.input_tokens > 0 and response.response_id.startswith("resp_")


async def test_an_agent_with_a_structured_output_type(model):
    agent = Agent(
        name="structured", instructions="Say the weather.", model=model, output_type=Weather
    )
    result = await Runner.run(agent, "Weather in Oslo for three days?", max_turns=1)
    assert isinstance(result.final_output, Weather)
    assert 1 <= result.final_output.days <= 7 and len(result.final_output.city) <= 12


async def test_an_agent_streamed(model):
    agent = Agent(name="structured", model=model, output_type=Weather)
    result = Runner.run_streamed(agent, "Weather?", max_turns=1)
    kinds = [event.type async for event in result.stream_events()]
    assert "raw_response_event" in kinds
    assert isinstance(result.final_output, Weather)
