"""The lazy tool-call grammar of ``tool_choice`` "auto" end to end, through
the official ``openai`` and ``ollama`` clients (issue 13).

With "auto" nothing is forced: the model writes freely, and only once it
writes its format's trigger is the rest held to the call grammar. A
random-weight model never chooses to call, so these models are generated
with a favourite token (``DemoModelSpec.favourite``): greedy decoding
writes it wherever it may. The "eager" models' favourite is their format's
trigger (``<tool_call>``, one user-defined token as in Qwen's vocabulary;
``{`` for Llama 3's bare JSON calls), so they open a call of their own
accord and the grammar makes the call valid; the same template without a
favourite ("plain") writes text, and gets it back as content."""

import json

import jsonschema
import pytest
from test_tools_api import ASK, PARAMETERS, WEATHER

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

QWEN = read_template("Qwen-Qwen2.5-7B-Instruct")
LLAMA3 = read_template("meta-llama-Llama-3.1-8B-Instruct")
MODELS = {
    "eager-qwen": DemoModelSpec(
        chat_template=QWEN, extra_tokens=("<tool_call>", "</tool_call>"), favourite="<tool_call>"
    ),
    "eager-llama3": DemoModelSpec(chat_template=LLAMA3, favourite="{"),
    "plain-qwen": DemoModelSpec(chat_template=QWEN, extra_tokens=("<tool_call>", "</tool_call>")),
}
# ollama's client sends a tool's parameters through its own model, which
# keeps types, required and enums but drops bounds such as maxLength: an
# unbounded string would hold the favourite token until num_predict ran out
ENUMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Paris"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
FORECAST = {
    "type": "function",
    "function": {"name": "forecast", "description": "Forecast", "parameters": ENUMS},
}


@pytest.fixture
def models(models_dir, tmp_path_factory):
    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("auto")
    for name, spec in MODELS.items():
        path = write_demo_model(folder / f"{name}.gguf", spec)
        store.create(name, {f"{name}.gguf": store.add_blob_from_file(path)})
    return list(MODELS)


def chat(**extra):
    return {"messages": ASK, "max_tokens": 120, "temperature": 0, **extra}


async def test_the_favourite_is_written_freely_without_tools(openai_client, models):
    """The control: no tools, no grammar; what the eager models write is
    their trigger, over and over, as plain content."""
    r = await openai_client.chat.completions.create(model="eager-qwen", **chat(max_tokens=5))
    assert r.choices[0].message.content == "<tool_call>" * 5
    r = await openai_client.chat.completions.create(model="eager-llama3", **chat(max_tokens=5))
    assert r.choices[0].message.content == "{" * 5


@pytest.mark.parametrize("model", ["eager-qwen", "eager-llama3"])
@pytest.mark.parametrize("choice", ["auto", None])  # None: not sent, "auto" by default
async def test_a_call_the_model_opens_is_valid_through_the_openai_client(
    openai_client, models, model, choice
):
    extra = {} if choice is None else {"tool_choice": choice}
    r = await openai_client.chat.completions.create(model=model, **chat(tools=[WEATHER], **extra))
    choice_ = r.choices[0]
    assert choice_.finish_reason == "tool_calls"
    assert not choice_.message.content
    [call] = choice_.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)


async def test_a_call_the_model_opens_streams_through_the_openai_client(openai_client, models):
    stream = await openai_client.chat.completions.create(
        model="eager-qwen", **chat(tools=[WEATHER], tool_choice="auto", stream=True)
    )
    chunks = [c async for c in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in deltas for t in (d.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    arguments = "".join(t.function.arguments or "" for t in calls)
    jsonschema.validate(json.loads(arguments), PARAMETERS)
    assert not "".join(d.content or "" for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize("model", ["eager-qwen", "eager-llama3"])
async def test_a_call_the_model_opens_through_the_ollama_client(ollama_client, models, model):
    options = {"temperature": 0, "num_predict": 120}
    r = await ollama_client.chat(model, messages=ASK, tools=[FORECAST], options=options)
    [call] = r.message.tool_calls
    assert call.function.name == "forecast" and not r.message.content
    assert r.done_reason == "stop"
    jsonschema.validate(dict(call.function.arguments), ENUMS)
    parts = [
        p
        async for p in await ollama_client.chat(
            model, messages=ASK, tools=[FORECAST], options=options, stream=True
        )
    ]
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.name for c in streamed] == ["forecast"]
    jsonschema.validate(dict(streamed[0].function.arguments), ENUMS)


async def test_a_model_that_does_not_open_a_call_answers_in_content(
    openai_client, ollama_client, models
):
    """Same template and tools, no favourite: nothing triggers the grammar,
    so nothing is forced; the text is content, as long as the model runs."""
    r = await openai_client.chat.completions.create(
        model="plain-qwen", **chat(tools=[WEATHER], tool_choice="auto", max_tokens=30)
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content and "<tool_call>" not in choice.message.content
    assert r.usage.completion_tokens == 30
    options = {"temperature": 0, "num_predict": 30}
    o = await ollama_client.chat("plain-qwen", messages=ASK, tools=[WEATHER], options=options)
    assert not o.message.tool_calls and o.message.content == choice.message.content
    assert o.done_reason == "length"
