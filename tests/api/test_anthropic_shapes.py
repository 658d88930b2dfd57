"""Anthropic's translations as tables: a Messages body into one generation
request (content blocks into the chat every API shares), a finished
generation and its stream of events into Anthropic's message and events,
and every bound a Messages body adds (``request/limits.py``)."""

from __future__ import annotations

import base64
import struct

import pytest

from jupyter_llm.api.anthropic_shapes import (
    MessageEvents,
    anthropic_error,
    count_call,
    message,
    messages_call,
)
from jupyter_llm.api.base import NAMED_SSE
from jupyter_llm.api.generation import Finished, Reply, Thinking, ToolCalls
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import CONTENT_BLOCKS, STOP_STRINGS, SYSTEM_BYTES, TOOL_NAME

PNG = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII5x", 13, b"IHDR", 2, 2)
PNG64 = base64.b64encode(PNG).decode()
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG64}}
TOOL = {
    "name": "get_weather",
    "description": "Weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
BASE = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}


def call(**fields):
    return messages_call({**BASE, **fields}).generation


def refused(match: str, **fields) -> None:
    with pytest.raises(InvalidRequest, match=match):
        messages_call({**BASE, **fields})


def test_a_plain_body():
    c = messages_call({**BASE, "stream": True, "temperature": 0.5, "top_k": 3})
    assert c.stream
    r = c.generation
    assert r.model.display == "m:latest"
    assert r.messages == [{"role": "user", "content": "Hi"}]
    assert r.options == {"temperature": 0.5, "top_p": 1.0, "top_k": 3, "num_predict": 8}
    assert r.think is None and r.tools is None and r.tool_choice is None


def test_system_as_a_string_or_text_blocks():
    assert call(system="Be brief").messages[0] == {"role": "system", "content": "Be brief"}
    blocks = [{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {}}]
    assert call(system=blocks).messages[0] == {"role": "system", "content": "A\n\nB"}
    refused(r"system\[0\] must be a text block", system=[IMAGE])


def test_a_tool_round_trip_becomes_tool_calls_and_a_named_tool_message():
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Oslo?"}, IMAGE]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "and tomorrow?"},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "rain"}, IMAGE],
                    "is_error": True,
                }
            ],
        },
    ]
    r = call(messages=history, tools=[TOOL])
    assert r.messages == [
        {"role": "user", "content": "Oslo?", "images": [PNG64]},
        {
            "role": "assistant",
            "content": "Let me look.",
            "thinking": "hmm",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                    "id": "toolu_1",
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1", "tool_name": "get_weather"},
        {"role": "user", "content": "and tomorrow?"},
        {
            "role": "tool",
            "content": "Error: rain",
            "images": [PNG64],
            "tool_call_id": "toolu_1",
            "tool_name": "get_weather",
        },
    ]
    assert r.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": TOOL["input_schema"],
            },
        }
    ]
    assert r.parallel_tool_calls is True  # Anthropic's default


@pytest.mark.parametrize(
    ("choice", "runner", "parallel"),
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "get_weather"}, {"name": "get_weather"}, True),
        ({"type": "none"}, "none", True),
    ],
)
def test_tool_choice(choice, runner, parallel):
    r = call(tools=[TOOL], tool_choice=choice)
    assert (r.tool_choice, r.parallel_tool_calls) == (runner, parallel)


@pytest.mark.parametrize(
    ("thinking", "think"),
    [
        (None, None),
        ({"type": "enabled", "budget_tokens": 4, "display": "summarized"}, True),
        ({"type": "disabled"}, False),
        ({"type": "adaptive"}, None),
        ({"type": "between_tools"}, None),
    ],
)
def test_thinking_is_think(thinking, think):
    r = call(thinking=thinking)
    assert r.think is think and r.relax_think  # a model that cannot think answers without


@pytest.mark.parametrize(
    ("thinking", "config", "think"),
    [  # output_config.effort is the level where thinking leaves it to the model, as in Ollama
        (None, {"effort": "low"}, "low"),
        (None, {"effort": " XHigh "}, "high"),
        ({"type": "adaptive"}, {"effort": "max"}, "max"),
        ({"type": "disabled"}, {"effort": "high"}, False),
        ({"type": "enabled", "budget_tokens": 4}, {"effort": "low"}, True),
        (None, {"effort": "extreme"}, None),
        (None, {"effort": 3}, None),
    ],
)
def test_effort_is_the_thinking_level(thinking, config, think):
    fields = (
        {"output_config": config}
        if thinking is None
        else {"thinking": thinking, "output_config": config}
    )
    assert call(**fields).think == think


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"max_tokens": True}, "max_tokens must be a positive integer"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "system", "content": "x"}]}, r"messages\[0\].role must be"),
        ({"messages": [{"role": "user", "content": 3}]}, "string or a list of content blocks"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "'document' blocks"),
        ({"messages": [{"role": "assistant", "content": [IMAGE]}]}, "'image' blocks are not"),
        ({"temperature": 1.5}, "temperature must be between 0 and 1"),
        ({"top_p": -0.1}, "top_p must be between 0 and 1"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"stop_sequences": "x"}, "stop_sequences must be a list of strings"),
        ({"thinking": {"type": "enabled"}}, "budget_tokens must be a positive integer"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8}}, "less than max_tokens"),
        ({"thinking": {"type": "on"}}, "thinking.type must be"),
        ({"output_config": {"format": {"type": "json"}}}, "output_config.format must be"),
        ({"output_config": {"format": {"type": "json_schema", "schema": 3}}}, "invalid format"),
        ({"tools": [{"type": "web_search_20250305", "name": "w"}]}, "is a server tool"),
        ({"tools": [{"name": "t"}]}, r"tools\[0\].input_schema must be a JSON Schema"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "x"}}, "not in tools"),
        ({"tool_choice": {"type": "any"}}, 'tool_choice "any" needs tools'),
        ({"tool_choice": "auto"}, "tool_choice.type must be"),
    ],
)
def test_bad_bodies_are_refused(fields, match):
    refused(match, **fields)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ({"type": "url", "url": "https://example.com/a.png"}, "does not fetch images"),
        ({"type": "base64", "media_type": "text/plain", "data": PNG64}, "an image type"),
        ({"type": "base64", "media_type": "image/png", "data": "!!"}, "not valid base64"),
        (None, "source must be"),
    ],
)
def test_bad_images_are_refused(source, match):
    content = [{"type": "image", "source": source}]
    refused(match, messages=[{"role": "user", "content": content}])


def test_output_config_format_is_a_grammar_and_effort_has_no_effect():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    config = {"effort": "high", "format": {"type": "json_schema", "schema": schema}}
    r = call(output_config=config)
    assert r.format is not None and "root" in r.format.grammar
    assert call(output_config={"effort": "low"}).format is None


def test_count_tokens_evaluates_the_prompt_and_generates_nothing():
    r = count_call({"model": "m", "messages": BASE["messages"], "system": "S"})
    assert r.options == {"num_predict": 0} and r.truncate is False
    assert r.messages[0] == {"role": "system", "content": "S"}


# -- the bounds a Messages body adds -------------------------------------------------------------
def test_content_blocks_are_bounded_across_the_request():
    text = {"type": "text", "text": "x"}
    half = CONTENT_BLOCKS.value // 2
    messages = [{"role": "user", "content": [text] * half}]
    call(messages=messages, system=[text] * (CONTENT_BLOCKS.value - half))
    refused("content_blocks", messages=messages, system=[text] * (CONTENT_BLOCKS.value - half + 1))


def test_system_is_bounded():
    call(system="é" * (SYSTEM_BYTES.value // 2))
    refused(
        r"system has 4,194,306 bytes.*\(system_bytes\)", system="é" * (SYSTEM_BYTES.value // 2 + 1)
    )


def test_tool_names_are_bounded():
    long = "t" * (TOOL_NAME.value + 1)
    refused(r"tools\[0\].name.*\(tool_name\)", tools=[{**TOOL, "name": long}])
    use = {"type": "tool_use", "id": "a", "name": long, "input": {}}
    refused(r"content\[0\].name.*\(tool_name\)", messages=[{"role": "assistant", "content": [use]}])


def test_stop_sequences_are_bounded():
    refused("stop_strings", stop_sequences=["s"] * (STOP_STRINGS.value + 1))


# -- a generation -> Anthropic's objects ----------------------------------------------------------
def done(reason: str = "stop", stop: str = "") -> Finished:
    return Finished(reason, 7, 1, 3, 1, 0, 2, [], stop_sequence=stop)


@pytest.mark.parametrize(
    ("finished", "calls", "reason", "sequence"),
    [
        (done(), [], "end_turn", None),
        (done("length"), [], "max_tokens", None),
        (done("stop", "END"), [], "stop_sequence", "END"),
        (done(), [{"id": "c1", "name": "f", "arguments": {"a": 1}}], "tool_use", None),
    ],
)
def test_a_whole_message(finished, calls, reason, sequence):
    m = message("m:latest", Reply("Hello", "hmm", calls, finished))
    assert m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_")
    assert (m["stop_reason"], m["stop_sequence"]) == (reason, sequence)
    assert m["usage"] == {"input_tokens": 7, "output_tokens": 3}
    blocks = [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Hello"},
    ]
    if calls:
        blocks.append({"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}})
    assert m["content"] == blocks


def test_a_stream_opens_and_closes_each_block():
    events = MessageEvents("m:latest")
    first = events.batch([Thinking("a"), Thinking("b"), "Hi"])
    second = events.batch([" there", ToolCalls([{"id": "c", "name": "f", "arguments": {"x": 1}}])])
    last = events.batch([done()])
    out = first + second + last
    assert [e["type"] for e in out] == [
        "message_start",
        "content_block_start",  # 0: thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # its signature
        "content_block_stop",
        "content_block_start",  # 1: text
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 2: tool_use
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert out[0]["message"]["content"] == [] and out[0]["message"]["model"] == "m:latest"
    assert [e.get("index") for e in out[1:13]] == [0] * 5 + [1] * 4 + [2] * 3
    assert out[2]["delta"] == {"type": "thinking_delta", "thinking": "a"}
    assert out[7]["delta"] == {"type": "text_delta", "text": "Hi"}
    assert out[8]["delta"] == {"type": "text_delta", "text": " there"}
    assert out[10]["content_block"] == {"type": "tool_use", "id": "c", "name": "f", "input": {}}
    assert out[11]["delta"] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert out[13]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[13]["usage"] == {"input_tokens": 7, "output_tokens": 3}


def test_an_empty_batch_still_starts_the_message():
    assert [e["type"] for e in MessageEvents("m").batch([])] == ["message_start"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (503, "overloaded_error"),
        (500, "api_error"),
    ],
)
def test_errors_in_anthropics_shape(status, kind):
    assert anthropic_error(status, "m") == {
        "type": "error",
        "error": {"type": kind, "message": "m"},
    }


def test_each_event_is_named_by_its_type_an_error_mid_stream_too():
    assert NAMED_SSE.encode({"type": "message_stop"}) == (
        'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    )
    assert NAMED_SSE.encode(anthropic_error(500, "gone")).startswith("event: error\ndata: ")
    assert NAMED_SSE.trailer == ""  # no [DONE]: message_stop ends it
