"""OpenAI's Responses API (issue 28, item 1) with the official ``openai``
client against the running server and real runners on the demo model:
whole and streamed responses, text.format through the grammar, a function
tool round trip on a Hermes template, previous_response_id, and 400/404s in
OpenAI's shape."""

from __future__ import annotations

import base64
import io
import json

import jsonschema
import openai
import pytest

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": SCHEMA,
}
FORCED = {"type": "function", "name": "get_weather"}


@pytest.fixture
def client(openai_client):
    return openai_client


@pytest.fixture
def hermes(models_dir, tmp_path_factory):
    """The demo model under Qwen 2.5's chat template (Hermes-style tool calls), as ``qwen``."""
    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("responses-hermes")
    spec = DemoModelSpec(
        chat_template=read_template("Qwen-Qwen2.5-7B-Instruct"), context_length=4096
    )
    path = write_demo_model(folder / "qwen.gguf", spec)
    store.create("qwen", {"qwen.gguf": store.add_blob_from_file(path)})
    return "qwen"


async def test_a_plain_response_and_its_stream(client, installed_model):
    r = await client.responses.create(
        model="tiny", instructions="Be brief.", input="hi", max_output_tokens=6, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in r.output] == ["message"] and r.output_text
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.usage.output_tokens_details.reasoning_tokens == 0  # a model that does not think
    assert r.instructions == "Be brief." and r.temperature == 0

    stream = await client.responses.create(
        model="tiny",
        instructions="Be brief.",
        input="hi",
        max_output_tokens=6,
        temperature=0,
        stream=True,
    )
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 6


async def test_the_stream_helper_and_a_complete_answer(client, installed_model):
    """``responses.stream`` wants ``response.completed``: an answer the
    schema's grammar ends (a cut one ends ``response.incomplete``, as OpenAI's)."""
    fmt = {"type": "json_schema", "name": "weather", "schema": SCHEMA}
    async with client.responses.stream(
        model="tiny",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        text={"format": fmt},
        max_output_tokens=200,
        temperature=0,
    ) as stream:
        texts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert final.status == "completed" and "".join(texts) == final.output_text
    jsonschema.validate(json.loads(final.output_text), SCHEMA)


async def test_text_format_json_schema_and_object(client, installed_model):
    fmt = {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}
    r = await client.responses.create(
        model="tiny", input="weather?", text={"format": fmt}, max_output_tokens=200, temperature=0
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    r = await client.responses.create(
        model="tiny",
        input="json",
        text={"format": {"type": "json_object"}},
        max_output_tokens=200,
        temperature=0,
    )
    assert isinstance(json.loads(r.output_text), dict)


async def test_a_function_tool_round_trip(client, hermes):
    r = await client.responses.create(
        model=hermes,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice=FORCED,
        max_output_tokens=200,
    )
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), SCHEMA)

    async with client.responses.stream(
        model=hermes,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice=FORCED,
        max_output_tokens=200,
    ) as stream:
        done = [e async for e in stream if e.type == "response.function_call_arguments.done"]
        final = await stream.get_final_response()
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert done[0].arguments == streamed.arguments and done[0].name == "get_weather"

    follow = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    reply = await client.responses.create(
        model=hermes, input=follow, tools=[WEATHER], max_output_tokens=4, temperature=0
    )
    assert reply.status in ("completed", "incomplete") and reply.usage.input_tokens > 0
    # the tool output reached the template: a longer one makes a longer prompt
    follow[-1]["output"] = "sunny, 21 C, light wind from the west"
    longer = await client.responses.create(
        model=hermes, input=follow, tools=[WEATHER], max_output_tokens=1
    )
    assert longer.usage.input_tokens > reply.usage.input_tokens


async def test_previous_response_id(client, installed_model):
    first = await client.responses.create(
        model="tiny", input="hello there", max_output_tokens=4, temperature=0
    )
    second = await client.responses.create(
        model="tiny",
        input="and again",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
    )
    alone = await client.responses.create(
        model="tiny", input="and again", max_output_tokens=4, temperature=0
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > alone.usage.input_tokens  # the first turn came before
    third = await client.responses.create(
        model="tiny", input="more", previous_response_id=second.id, max_output_tokens=1
    )
    assert third.usage.input_tokens > second.usage.input_tokens

    unstored = await client.responses.create(
        model="tiny", input="x", store=False, max_output_tokens=1
    )
    for missing in (unstored.id, "resp_nothing"):
        with pytest.raises(openai.NotFoundError) as e:
            await client.responses.create(
                model="tiny", input="x", previous_response_id=missing, max_output_tokens=1
            )
        assert "was not found" in e.value.body["message"]


async def test_a_stored_response_is_retrieved_and_deleted(client, installed_model):
    made = await client.responses.create(
        model="tiny", input="hello there", max_output_tokens=3, temperature=0
    )
    got = await client.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    assert got.usage.output_tokens == made.usage.output_tokens
    stream = await client.responses.create(
        model="tiny", input="hi", max_output_tokens=2, stream=True
    )
    async for event in stream:
        if event.type in ("response.completed", "response.incomplete"):
            streamed = event.response
    assert (await client.responses.retrieve(streamed.id)).output_text == streamed.output_text

    await client.responses.delete(made.id)
    unstored = await client.responses.create(
        model="tiny", input="x", store=False, max_output_tokens=1
    )
    for missing in (made.id, unstored.id, "resp_nothing"):
        with pytest.raises(openai.NotFoundError) as e:
            await client.responses.retrieve(missing)
        assert "was not found" in e.value.body["message"]
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(missing)
    with pytest.raises(openai.BadRequestError) as e:
        await client.responses.retrieve("r" * 200)
    assert "response_id" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await client.responses.retrieve(streamed.id, stream=True)
    assert "cannot be streamed again" in e.value.body["message"]


BAD = [
    ({"input": []}, "input must be"),
    ({"input": 3}, "input must be"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "items are not supported"),
    ({"input": [{"role": "robot", "content": "x"}]}, "role must be"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "parts are not supported",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://x/y.png"}],
                }
            ]
        },
        "does not fetch",
    ),
    ({"input": "x", "instructions": 5}, "instructions must be a string"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "not in tools"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format must be"),
    ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning_effort must be"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 9}, "temperature"),
    ({"input": "x", "store": "yes"}, "store must be a boolean"),
    ({"input": "x", "previous_response_id": "r" * 200}, "response_id"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata_keys"),
    ({"input": [{"role": "user", "content": "x"}] * 16385}, "input_items"),
    ({"input": "x", "instructions": "i" * (4 * 2**20 + 1)}, "instructions_bytes"),
    ({"input": [{"type": "function_call_output", "call_id": "", "output": "x"}]}, "call_id"),
]


@pytest.mark.parametrize("body, says", BAD, ids=[b[1] for b in BAD])
async def test_bad_requests_are_400s_in_openais_shape(client, installed_model, body, says):
    """The body goes as it is (``extra_body``): the client's own typed
    transform takes seconds over 16k input items and checks nothing."""
    with pytest.raises(openai.BadRequestError) as e:
        await client.responses.create(model="tiny", extra_body=body)
    assert says in e.value.body["message"] and e.value.body["type"] == "invalid_request_error"


async def test_an_unknown_model_is_a_404(client, installed_model):
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="nothing", input="x")


async def test_a_streamed_response_is_stored_before_it_is_done(client, installed_model):
    stream = await client.responses.create(
        model="tiny", input="hello there", max_output_tokens=3, stream=True
    )
    async for event in stream:
        if event.type in ("response.completed", "response.incomplete"):
            first = event.response
            break  # at once: the id must already work
    second = await client.responses.create(
        model="tiny", input="and again", previous_response_id=first.id, max_output_tokens=1
    )
    assert second.previous_response_id == first.id


async def test_a_tool_output_continues_a_stored_call(client, hermes):
    """Only the function_call_output is sent: the call comes from the store,
    and the output reaches the template under the call's tool name."""
    r = await client.responses.create(
        model=hermes,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice=FORCED,
        max_output_tokens=200,
    )
    (call,) = [item for item in r.output if item.type == "function_call"]

    async def answer(output: str):
        return await client.responses.create(
            model=hermes,
            previous_response_id=r.id,
            tools=[WEATHER],
            max_output_tokens=1,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],
        )

    short, long = await answer("sunny"), await answer("sunny, 21 C, light wind from the west")
    assert short.usage.input_tokens > r.usage.input_tokens
    assert long.usage.input_tokens > short.usage.input_tokens


@pytest.fixture
def qwq(models_dir, tmp_path_factory):
    """The demo model under QwQ's template, whose prompt opens ``<think>``."""
    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("responses-qwq")
    spec = DemoModelSpec(chat_template=read_template("Qwen-QwQ-32B"), context_length=4096)
    path = write_demo_model(folder / "qwq.gguf", spec)
    store.create("qwq", {"qwq.gguf": store.add_blob_from_file(path)})
    return "qwq"


async def test_reasoning_is_a_reasoning_item(client, qwq):
    kwargs = {"model": qwq, "input": "hi", "max_output_tokens": 12, "temperature": 0}
    r = await client.responses.create(**kwargs, reasoning={"effort": "high"})
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text
    assert r.reasoning.effort == "high"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    stream = await client.responses.create(**kwargs, reasoning={"effort": "high"}, stream=True)
    events = [e async for e in stream]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == r.output[0].content[0].text == events[-1].response.output[0].content[0].text
    # sent back as an item, it is the assistant turn's thinking: the prompt has it
    back = [{"role": "user", "content": "hi"}, r.output[0].model_dump(exclude_none=True)]
    back.append({"role": "user", "content": "and?"})
    again = await client.responses.create(model=qwq, input=back, max_output_tokens=1)
    assert again.usage.input_tokens > r.usage.input_tokens


@pytest.fixture
def vision_model(models_dir, tmp_path_factory) -> str:
    from jupyter_llm.demo import write_vision_model

    files = write_vision_model(tmp_path_factory.mktemp("vision"), "tiny-vision")
    store = ModelStore(models_dir)
    store.create("seer", {p.name: store.add_blob_from_file(p) for p in files})
    return "seer"


async def test_an_input_image_reaches_the_model(client, vision_model):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (24, 24), (200, 30, 90)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    question = {"type": "input_text", "text": "What is this?"}
    image = {"type": "input_image", "image_url": url, "detail": "auto"}
    kwargs = {"model": vision_model, "max_output_tokens": 2, "temperature": 0}
    text = await client.responses.create(**kwargs, input=[{"role": "user", "content": [question]}])
    seen = await client.responses.create(
        **kwargs, input=[{"role": "user", "content": [image, question]}]
    )
    assert seen.usage.input_tokens > text.usage.input_tokens


async def test_an_error_mid_stream_is_an_error_event(client, installed_model, monkeypatch):
    """After the first event, a failure is an ``error`` event the client raises.

    The generation fails right after its first batch, whatever that batch
    holds, so the failure comes after ``response.created`` however the
    runner happened to group its tokens."""
    from contextlib import aclosing

    from jupyter_llm.api import base
    from jupyter_llm.api.generation import Finished

    real = base.complete

    async def failing(*args, **kwargs):
        async with aclosing(real(*args, **kwargs)) as batches:
            async for batch in batches:
                yield [event for event in batch if not isinstance(event, Finished)]
                raise RuntimeError("boom")

    monkeypatch.setattr(base, "complete", failing)
    stream = await client.responses.create(
        model="tiny", input="hi", max_output_tokens=8, temperature=0, stream=True
    )
    seen = []
    with pytest.raises(openai.APIError, match="internal error"):
        async for event in stream:
            seen.append(event.type)
    assert seen[0] == "response.created"


async def test_the_response_echoes_only_the_fields_openai_has(client, hermes):
    """Keys a client adds to a tool or to text.format are not written into the
    response (three times in a stream, and kept for GET)."""
    raw = await client.responses.with_raw_response.create(
        model=hermes,
        input="x",
        max_output_tokens=1,
        extra_body={
            "tools": [{**WEATHER, "pad": "p" * 1000}],
            "tool_choice": {"type": "function", "name": "get_weather", "pad": "c"},
            "text": {"format": {"type": "text", "pad": "q" * 1000}},
        },
    )
    made = raw.http_response.json()
    assert made["tools"] == [WEATHER]
    assert made["tool_choice"] == FORCED
    assert made["text"] == {"format": {"type": "text"}}


async def test_a_conversation_continued_past_its_limit_is_a_400(
    client, installed_model, monkeypatch
):
    from dataclasses import replace

    from jupyter_llm.api import openai_responses
    from jupyter_llm.request.limits import CONVERSATION_BYTES

    monkeypatch.setattr(
        openai_responses, "CONVERSATION_BYTES", replace(CONVERSATION_BYTES, value=2000)
    )
    first = await client.responses.create(model="tiny", input="x " * 600, max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:
        await client.responses.create(
            model="tiny", input="y " * 600, previous_response_id=first.id, max_output_tokens=1
        )
    assert "the limit is 2,000 bytes (conversation_bytes)" in e.value.body["message"]
