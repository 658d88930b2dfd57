"""Tool calls and thinking end to end, through the official ``ollama`` and
``openai`` clients, on generated models carrying real chat templates. The
random-weight models cannot choose to call a tool; ``tool_choice`` forces
a call and the grammar makes it valid (issue 13)."""

import json

import jsonschema
import ollama
import openai
import pytest

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMETERS},
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
        },
    },
}
TEMPLATES = {
    "qwen": "Qwen-Qwen2.5-7B-Instruct",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407",
    "qwen3": "Qwen-Qwen3-0.6B",
    "r1": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "qwq": "Qwen-QwQ-32B",  # its prompt opens <think>: the answer starts thinking
    "gemma2": "google-gemma-2-2b-it",
}


@pytest.fixture
def family_models(models_dir, tmp_path_factory):
    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("families")
    for name, template in TEMPLATES.items():
        spec = DemoModelSpec(chat_template=read_template(template), context_length=4096)
        path = write_demo_model(folder / f"{name}.gguf", spec)
        store.create(name, {f"{name}.gguf": store.add_blob_from_file(path)})
    return list(TEMPLATES)


ASK = [{"role": "user", "content": "What is the weather in Oslo this week?"}]


@pytest.mark.parametrize("model", ["qwen", "llama3", "mistral"])
async def test_a_forced_call_is_valid_through_the_openai_client(
    openai_client, family_models, model
):
    r = await openai_client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id
    assert call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    schema = PARAMETERS if call.function.name == "get_weather" else TIME["function"]["parameters"]
    jsonschema.validate(arguments, schema)


async def test_a_named_tool_streams_through_the_openai_client(openai_client, family_models):
    stream = await openai_client.chat.completions.create(
        model="qwen",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    chunks = [c async for c in stream]
    calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_a_forced_call_through_the_ollama_client(ollama_client, family_models):
    options = {**GREEDY, "num_predict": 200, "tool_choice": "required"}
    r = await ollama_client.chat("qwen", messages=ASK, tools=[WEATHER], options=options)
    call = r.message.tool_calls[0]
    assert call.function.name == "get_weather"
    # ollama's client sends a tool's parameters through its own model, which
    # keeps types, required and enums but drops bounds such as maximum
    sent = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    jsonschema.validate(dict(call.function.arguments), sent)
    parts = [
        p
        async for p in await ollama_client.chat(
            "qwen", messages=ASK, tools=[WEATHER], options=options, stream=True
        )
    ]
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.name for c in streamed] == ["get_weather"]
    assert parts[-1].done


async def test_tool_results_in_the_history_are_answered(
    openai_client, ollama_client, family_models
):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = await openai_client.chat.completions.create(
        model="qwen", messages=history, tools=[WEATHER], max_tokens=4, temperature=0
    )
    assert r.choices[0].finish_reason in ("length", "stop")
    ollama_history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}
            ],
        },
        {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21 C"},
    ]
    options = {**GREEDY, "num_predict": 4}
    r = await ollama_client.chat(
        "llama3", messages=ollama_history, tools=[WEATHER], options=options
    )
    assert r.done


async def test_a_model_without_tools_says_so(openai_client, family_models):
    with pytest.raises(openai.BadRequestError, match="does not support tools"):
        await openai_client.chat.completions.create(
            model="gemma2", messages=ASK, tools=[WEATHER], max_tokens=4
        )


async def test_thinking_requests_the_model_cannot_honour_are_400s(ollama_client, family_models):
    with pytest.raises(ollama.ResponseError, match="cannot turn thinking off"):
        await ollama_client.chat("r1", messages=ASK, think=False, options={"num_predict": 2})
    with pytest.raises(ollama.ResponseError, match="does not support thinking"):
        await ollama_client.chat("gemma2", messages=ASK, think=True, options={"num_predict": 2})


async def test_show_lists_thinking_and_tools(ollama_client, family_models):
    qwen3 = await ollama_client.show("qwen3")
    assert {"completion", "tools", "thinking"} <= set(qwen3.capabilities)
    gemma2 = await ollama_client.show("gemma2")
    assert "thinking" not in gemma2.capabilities and "tools" not in gemma2.capabilities


async def test_thinking_never_reaches_content(ollama_client, openai_client, family_models):
    options = {**GREEDY, "num_predict": 8}
    r = await ollama_client.chat("qwq", messages=ASK, think=True, options=options)
    assert r.message.thinking and not r.message.content
    parts = [
        p
        async for p in await ollama_client.chat(
            "qwq", messages=ASK, think=True, options=options, stream=True
        )
    ]
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    assert not "".join(p.message.content for p in parts)
    c = await openai_client.chat.completions.create(
        model="qwq", messages=ASK, reasoning_effort="high", max_tokens=8, temperature=0
    )
    message = c.choices[0].message
    assert message.reasoning == r.message.thinking and not message.content
