"""Conformance with the official ``anthropic`` client against the running
server and real runners: plain and streamed messages, stop sequences,
count_tokens, a tool round trip on a Hermes template, an image on the tiny
vision model, thinking on a template that opens ``<think>``, and errors
in Anthropic's shape (issue 28, item 2)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

# the 2.x client no longer sends sampling fields; older clients and other SDKs do
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}
FORCED = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
TEMPLATES = {
    "qwen": "Qwen-Qwen2.5-7B-Instruct",  # Hermes-style tool calls
    "qwq": "Qwen-QwQ-32B",  # its prompt opens <think>: the answer starts thinking
    "r1": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",  # cannot turn thinking off
}


@pytest.fixture
def base(jp_base_url, http_server, http_server_port) -> str:
    return f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm"


@pytest.fixture
def token(jp_serverapp) -> str:
    return jp_serverapp.identity_provider.token


@pytest.fixture
def client(base, token):
    """The official client as its users make it: the token is the api_key (x-api-key)."""
    return anthropic.AsyncAnthropic(base_url=base, api_key=token, max_retries=0)


@pytest.fixture
def templated(models_dir, tmp_path_factory):
    """The demo model under real chat templates."""
    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("anthropic-families")
    for name, template in TEMPLATES.items():
        spec = DemoModelSpec(chat_template=read_template(template), context_length=4096)
        path = write_demo_model(folder / f"{name}.gguf", spec)
        store.create(name, {f"{name}.gguf": store.add_blob_from_file(path)})


async def test_a_plain_message(client, installed_model):
    r = await client.messages.create(
        model="tiny", system="Be brief.", messages=ASK, max_tokens=6, extra_body=GREEDY
    )
    assert r.type == "message" and r.role == "assistant"
    assert r.model == "tiny"  # as written, as Ollama echoes it
    assert r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0


async def test_a_streamed_message_and_its_events(client, installed_model):
    kwargs = {"model": "tiny", "messages": ASK, "max_tokens": 6, "extra_body": GREEDY}
    whole = await client.messages.create(**kwargs)
    async with client.messages.stream(**kwargs) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == 6

    events = [e async for e in await client.messages.create(**kwargs, stream=True)]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


async def test_stop_sequences_say_which_one_ended_it(client, installed_model):
    kwargs = {"model": "tiny", "messages": ASK, "max_tokens": 30, "extra_body": GREEDY}
    text = (await client.messages.create(**kwargs)).content[0].text
    stop = text[4:7]
    r = await client.messages.create(**kwargs, stop_sequences=["\x01never", stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert text.startswith(r.content[0].text if r.content else "")
    async with client.messages.stream(**kwargs, stop_sequences=[stop]) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


async def test_output_config_format_holds_the_answer_to_a_schema(client, installed_model):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "city": {"type": "string", "maxLength": 8}},
        "required": ["ok", "city"],
        "additionalProperties": False,
    }
    r = await client.messages.create(
        model="tiny",
        messages=ASK,
        max_tokens=200,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    assert r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(r.content[0].text), schema)


async def test_count_tokens_is_the_prompt_the_model_sees(client, installed_model):
    r = await client.messages.create(model="tiny", system="S", messages=ASK, max_tokens=2)
    counted = await client.messages.count_tokens(model="tiny", system="S", messages=ASK)
    assert counted.input_tokens == r.usage.input_tokens
    longer = await client.messages.count_tokens(model="tiny", system="S " * 20, messages=ASK)
    assert longer.input_tokens > counted.input_tokens


async def test_a_tool_round_trip(client, templated):
    r = await client.messages.create(
        model="qwen", messages=ASK, tools=[WEATHER], tool_choice=FORCED, max_tokens=200
    )
    assert r.stop_reason == "tool_use"
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    jsonschema.validate(use.input, SCHEMA)

    async with client.messages.stream(
        model="qwen", messages=ASK, tools=[WEATHER], tool_choice=FORCED, max_tokens=200
    ) as stream:
        final = await stream.get_final_message()
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use"
    jsonschema.validate(streamed.input, SCHEMA)  # rebuilt from input_json_delta

    def history(result: str) -> list:
        answer = [{"type": "tool_result", "tool_use_id": use.id, "content": result}]
        return [
            *ASK,
            {"role": "assistant", "content": r.content},
            {"role": "user", "content": answer},
        ]

    reply = await client.messages.create(
        model="qwen", messages=history("sunny"), tools=[WEATHER], max_tokens=4, extra_body=GREEDY
    )
    assert reply.stop_reason in ("max_tokens", "end_turn", "tool_use")
    # the result reaches the template: a longer one is more tokens
    short = await client.messages.count_tokens(
        model="qwen", messages=history("sunny"), tools=[WEATHER]
    )
    long = await client.messages.count_tokens(
        model="qwen", messages=history("sunny, 21 C, light wind from the west"), tools=[WEATHER]
    )
    assert long.input_tokens > short.input_tokens == reply.usage.input_tokens


async def test_thinking_blocks_on_a_think_template(client, templated):
    kwargs = {
        "model": "qwq",
        "messages": ASK,
        "max_tokens": 12,
        "extra_body": GREEDY,
        "thinking": {"type": "enabled", "budget_tokens": 8},
    }
    r = await client.messages.create(**kwargs)
    assert r.content[0].type == "thinking" and r.content[0].thinking
    assert not [b for b in r.content if b.type == "text" and b.text]  # thinking never leaks
    async with client.messages.stream(**kwargs) as stream:
        deltas = [
            e.delta.thinking
            async for e in stream
            if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
        ]
        final = await stream.get_final_message()
    assert "".join(deltas) == final.content[0].thinking == r.content[0].thinking

    # thinking asked of a model that cannot think: answered without it, as Ollama
    # answers Claude Code (which asks it of every model), not a 400
    plain = await client.messages.create(**{**kwargs, "model": "qwen"})
    assert plain.content and not [b for b in plain.content if b.type == "thinking"]
    with pytest.raises(anthropic.BadRequestError, match="cannot turn thinking off") as info:
        await client.messages.create(
            model="r1", messages=ASK, max_tokens=2, thinking={"type": "disabled"}
        )
    assert info.value.body["error"]["type"] == "invalid_request_error"


@pytest.fixture
def vision_model(models_dir: Path, tmp_path_factory) -> str:
    from jupyter_llm.demo import write_vision_model

    files = write_vision_model(tmp_path_factory.mktemp("vision"), "tiny-vision")
    store = ModelStore(models_dir)
    store.create("seer", {p.name: store.add_blob_from_file(p) for p in files})
    return "seer"


def png(size: int = 24) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 90)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_an_image_reaches_the_model(client, vision_model):
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": png()},
    }
    question = {"type": "text", "text": "What is this?"}
    kwargs = {"model": "seer", "max_tokens": 2, "extra_body": GREEDY}
    text = await client.messages.create(
        **kwargs, messages=[{"role": "user", "content": [question]}]
    )
    seen = await client.messages.create(
        **kwargs, messages=[{"role": "user", "content": [image, question]}]
    )
    assert seen.usage.input_tokens > text.usage.input_tokens
    counted = await client.messages.count_tokens(
        model="seer", messages=[{"role": "user", "content": [image, question]}]
    )
    assert counted.input_tokens == seen.usage.input_tokens

    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError, match="does not fetch images"):
        await client.messages.create(**kwargs, messages=[{"role": "user", "content": [url]}])


# -- authentication and errors --------------------------------------------------------------------
async def test_a_bearer_token_works_and_a_wrong_key_is_a_401(base, token, installed_model):
    bearer = anthropic.AsyncAnthropic(base_url=base, auth_token=token, api_key=None, max_retries=0)
    r = await bearer.messages.create(model="tiny", messages=ASK, max_tokens=2)
    assert r.usage.output_tokens == 2

    wrong = anthropic.AsyncAnthropic(base_url=base, api_key="wrong", max_retries=0)
    for call in (
        wrong.messages.create(model="tiny", messages=ASK, max_tokens=2),
        wrong.messages.count_tokens(model="tiny", messages=ASK),
    ):
        with pytest.raises(anthropic.AuthenticationError, match="x-api-key") as info:
            await call
        assert info.value.status_code == 401
        assert info.value.body["type"] == "error"
        assert info.value.body["error"]["type"] == "authentication_error"


async def test_no_key_is_a_401_and_x_api_key_is_read_on_these_routes_only(base, token):
    async with httpx.AsyncClient() as http:
        none = await http.post(f"{base}/v1/messages", json={})
        assert none.status_code == 401
        assert none.json()["error"]["type"] == "authentication_error"
        # another API's route does not read x-api-key: a token there goes in Authorization
        other = await http.post(
            f"{base}/v1/chat/completions", json={}, headers={"x-api-key": token}
        )
        assert other.status_code == 401  # OpenAI's own 401 for no key
        assert other.json()["error"]["code"] == "invalid_api_key"


async def test_errors_in_anthropics_shape(client, base, token, installed_model):
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{base}/v1/messages",
            json={"model": "tiny", "messages": ASK},
            headers={"x-api-key": token, "anthropic-version": "2023-06-01"},
        )
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    with pytest.raises(anthropic.NotFoundError, match="model 'nothing:latest' not found") as info:
        await client.messages.create(model="nothing", messages=ASK, max_tokens=2)
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.count_tokens(model="nothing", messages=ASK)
    with pytest.raises(anthropic.BadRequestError, match="content_blocks"):
        text = {"type": "text", "text": "x"}
        await client.messages.create(
            model="tiny", messages=[{"role": "user", "content": [text] * 16385}], max_tokens=2
        )
