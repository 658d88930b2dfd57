"""OpenAI's translations as tables: bodies into one generation request, a
finished generation and its stream of events into OpenAI's objects."""

from __future__ import annotations

import json
import re
from typing import Any

import generation_fields
import pytest

from jupyter_llm.api.base import COMPACT, json_pieces
from jupyter_llm.api.generation import Embedded, Finished, Logprobs, Reply, Thinking, ToolCalls
from jupyter_llm.api.openai_shapes import (
    ChatChunks,
    CompletionChunks,
    chat_call,
    chat_completion,
    completion_call,
    embeddings_body,
    embeddings_call,
    text_completion,
)
from jupyter_llm.request.errors import InvalidRequest

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
USER = {"role": "user", "content": "Hi"}
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # OpenAI's, not Ollama's


def fields(call: Any) -> dict[str, Any]:
    return generation_fields.fields(call, OPENAI_DEFAULTS)


# (body, the request's fields that are set, stream, include_usage)
CHAT = [
    ({"model": "m", "messages": [USER]}, {"messages": [USER]}, False, False),
    (
        {
            "model": "m",
            "messages": [USER],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {"messages": [USER]},
        True,
        True,
    ),
    (
        {
            "model": "m",
            "messages": [USER],
            "max_tokens": 8,
            "temperature": 0,
            "seed": 1,
            "stop": "e",
        },
        {
            "messages": [USER],
            "options": {
                **OPENAI_DEFAULTS,
                "num_predict": 8,
                "temperature": 0,
                "seed": 1,
                "stop": ["e"],
            },
        },
        False,
        False,
    ),
    (
        {
            "model": "m",
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": True,
        },
        {
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": {"name": "get_weather"},
            "parallel_tool_calls": True,
        },
        False,
        False,
    ),
    (
        {"model": "m", "messages": [USER], "logprobs": True, "top_logprobs": 2},
        {"messages": [USER], "logprobs": 2},
        False,
        False,
    ),
    (
        {"model": "m", "messages": [USER], "reasoning_effort": "none"},
        {"messages": [USER], "think": False},
        False,
        False,
    ),
    (
        {"model": "m", "messages": [USER], "reasoning": {"effort": "low"}},
        {"messages": [USER], "think": "low"},
        False,
        False,
    ),
    (
        {"model": "m", "messages": [USER], "response_format": {"type": "json_object"}},
        {"messages": [USER], "format": "set"},
        False,
        False,
    ),
    (
        {"model": "m", "messages": [USER], "response_format": {"type": "text"}},
        {"messages": [USER]},
        False,
        False,
    ),
]


@pytest.mark.parametrize(("body", "expected", "stream", "usage"), CHAT)
def test_a_chat_body_is_one_generation_request(body, expected, stream, usage):
    call = chat_call(body)
    assert fields(call) == expected
    assert (call.stream, call.include_usage) == (stream, usage)


COMPLETIONS = [
    ({"model": "m"}, {"prompt": ""}),
    ({"model": "m", "prompt": ["Once"]}, {"prompt": "Once"}),
    ({"model": "m", "prompt": "def f(", "suffix": "x"}, {"prompt": "def f(", "suffix": "x"}),
    ({"model": "m", "prompt": "a", "logprobs": 0}, {"prompt": "a", "logprobs": 0}),
    ({"model": "m", "prompt": "a", "logprobs": 5}, {"prompt": "a", "logprobs": 5}),
]


@pytest.mark.parametrize(("body", "expected"), COMPLETIONS)
def test_a_completion_body_is_one_generation_request(body, expected):
    assert fields(completion_call(body)) == expected


# (translation, body, the 400's message): the first bad field is the one named
BAD = [
    (chat_call, {"messages": [USER]}, "model is required and must be a non-empty string"),
    (chat_call, {"model": "m"}, "messages must be a non-empty list"),
    (
        chat_call,
        {"model": "m", "messages": [USER], "temperature": "hot"},
        "temperature must be a number",
    ),
    (chat_call, {"model": "m", "messages": [USER], "tools": "x"}, "tools must be a list"),
    (chat_call, {"model": "m", "messages": "x", "tools": "x"}, "tools must be a list"),
    (
        chat_call,
        {"model": "m", "messages": [USER], "tools": [TOOL], "tool_choice": "sometimes"},
        'tool_choice must be "auto", "none", "required" or',
    ),
    (
        chat_call,
        {"model": "m", "messages": [USER], "tool_choice": {"function": {"name": "f"}}},
        "tool_choice names 'f', which is not in tools",
    ),
    (
        chat_call,
        {"model": "m", "messages": [USER], "parallel_tool_calls": 1},
        "parallel_tool_calls must be a boolean",
    ),
    (chat_call, {"model": "m", "messages": [USER], "logprobs": 1}, "logprobs must be a boolean"),
    (
        chat_call,
        {"model": "m", "messages": [USER], "top_logprobs": 21},
        "top_logprobs must be an integer between 0 and 20",
    ),
    (
        chat_call,
        {"model": "m", "messages": [USER], "reasoning_effort": "huge"},
        'reasoning_effort must be one of "none", "low", "medium", "high", "max", "minimal", '
        '"xhigh", "ultra"',
    ),
    (
        chat_call,
        {"model": "m", "messages": [USER], "response_format": {"type": "yaml"}},
        'response_format must be {"type": "text" | "json_object" | "json_schema"}',
    ),
    (
        chat_call,
        {"model": "m", "messages": [USER], "response_format": {"type": "json_schema"}},
        "invalid format",
    ),
    (chat_call, {"model": "m", "messages": [USER], "stream": "yes"}, "stream must be a boolean"),
    (
        chat_call,
        {"model": "m", "messages": [USER], "stream_options": 1},
        "stream_options must be an object",
    ),
    (
        completion_call,
        {"model": "m", "prompt": ["a", "b"]},
        "prompt must be a string (or a list of one string)",
    ),
    (completion_call, {"model": "m", "suffix": 1}, "suffix must be a string"),
    (completion_call, {"model": "m", "logprobs": 6}, "logprobs must be an integer between 0 and 5"),
    (
        completion_call,
        {"model": "m", "logprobs": True},
        "logprobs must be an integer between 0 and 5",
    ),
    (completion_call, {"model": "m", "logprobs": 6, "temperature": "hot"}, "logprobs must be"),
    (completion_call, {"model": "m", "temperature": "hot"}, "temperature must be a number"),
    (completion_call, {"model": "m", "stream": 1}, "stream must be a boolean"),
    (embeddings_call, {"model": "m", "input": []}, "input must not be empty"),
    (embeddings_call, {"model": "m", "input": 3}, "input must be a string or a list of strings"),
    (
        embeddings_call,
        {"model": "m", "input": "a", "encoding_format": "hex"},
        'encoding_format must be "float" or "base64"',
    ),
    (
        embeddings_call,
        {"model": "m", "input": "a", "dimensions": 0},
        "dimensions must be a positive integer",
    ),
    (
        embeddings_call,
        {"model": "m", "input": "a", "dimensions": True},
        "dimensions must be a positive integer",
    ),
]


@pytest.mark.parametrize(("translate", "body", "message"), BAD)
def test_a_bad_field_is_a_400_naming_it(translate, body, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        translate(body)


def test_an_embeddings_body():
    call = embeddings_call(
        {"model": "m", "input": "a", "encoding_format": "base64", "dimensions": 4}
    )
    assert (call.model.display, call.inputs, call.encoding, call.dimensions) == (
        "m:latest",
        ["a"],
        "base64",
        4,
    )


@pytest.mark.parametrize(
    "translate, base, key",
    [
        (chat_call, {"model": "m", "messages": [USER]}, "stream"),
        (chat_call, {"model": "m", "messages": [USER]}, "n"),
        (chat_call, {"model": "m", "messages": [USER]}, "stream_options"),
        (chat_call, {"model": "m", "messages": [USER]}, "parallel_tool_calls"),
        (completion_call, {"model": "m", "prompt": "x"}, "stream"),
        (completion_call, {"model": "m", "prompt": "x"}, "n"),
    ],
)
def test_a_null_field_is_its_default(translate, base, key):
    """openai-python types these Optional and sends an explicit null as given
    (``n=None``, ``stream=None``); Ollama decodes null as the default."""
    plain, nulled = translate(base), translate({**base, key: None})
    assert fields(nulled) == fields(plain) and nulled.stream is plain.stream is False


def test_a_null_store_is_stored():
    from jupyter_llm.api.openai_responses_shapes import responses_call

    assert responses_call({"model": "m", "input": "x", "store": None}, []).store is True


@pytest.mark.parametrize(
    "given, encoding",
    [(None, "float"), ("BASE64", "base64"), ("Float", "float"), ("base64", "base64")],
)
def test_encoding_format_is_read_as_ollama_reads_it(given, encoding):
    call = embeddings_call({"model": "m", "input": "a", "encoding_format": given})
    assert call.encoding == encoding


HEAD = {"id": "chatcmpl-1", "created": 9, "model": "m:latest", "system_fingerprint": "fp"}
DONE = Finished("stop", 4, 40, 2, 20, 5, 100, [])
LENGTH = Finished("length", 4, 40, 2, 20, 5, 100, [])
USAGE = {
    "prompt_tokens": 4,
    "completion_tokens": 2,
    "total_tokens": 6,
    "prompt_tokens_details": {"cached_tokens": 0},
}
CALL = {"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}}
ARGS = json.dumps({"city": "Paris"})
LOGPROB = {
    "token": "Hi",
    "logprob": -0.5,
    "bytes": [72, 105],
    "top_logprobs": [{"token": "Hi", "logprob": -0.5}],
}
CHUNK = {**HEAD, "object": "chat.completion.chunk"}


def delta(d: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {**CHUNK, "choices": [{"index": 0, "delta": d, "finish_reason": finish, **extra}]}


def streamed_call(index: int) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": ARGS}
    return {"index": index, "id": "c1", "type": "function", "function": function}


# (include_usage, batches of events, the chunks of each batch)
CHAT_STREAMS = [
    (
        True,
        [["Hel", "lo"], [LENGTH]],
        [
            [delta({"content": "Hel", "role": "assistant"}), delta({"content": "lo"})],
            [delta({}, "length"), {**CHUNK, "choices": [], "usage": USAGE}],
        ],
    ),
    (
        False,
        [[Thinking("hmm"), Logprobs([LOGPROB])], [ToolCalls([CALL]), ToolCalls([CALL])], [DONE]],
        [
            [
                delta({"role": "assistant", "reasoning": "hmm"}),
                delta({}, logprobs={"content": [LOGPROB]}),
            ],
            [delta({"tool_calls": [streamed_call(0)]}), delta({"tool_calls": [streamed_call(1)]})],
            [delta({}, "tool_calls")],
        ],
    ),
]


@pytest.mark.parametrize(("usage", "batches", "expected"), CHAT_STREAMS)
def test_chat_stream_events_become_chunks(usage, batches, expected):
    chunks = ChatChunks(HEAD, usage)
    assert [chunks.batch(batch) for batch in batches] == expected


def text(t: str, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    choice = {"index": 0, "text": t, "logprobs": logprobs, "finish_reason": finish}
    return {**HEAD, "object": "text_completion", "choices": [choice]}


def legacy(tokens: list[str], offsets: list[int]) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "token_logprobs": [-0.5] * len(tokens),
        "top_logprobs": [{"Hi": -0.5}] * len(tokens),
        "text_offset": offsets,
    }


COMPLETION_STREAMS = [
    (
        True,
        [["Hel", "lo"], [DONE]],
        [
            [text("Hel"), text("lo")],
            [
                text("", "stop"),
                {**HEAD, "object": "text_completion", "choices": [], "usage": USAGE},
            ],
        ],
    ),
    (
        False,
        [["Hi", Logprobs([LOGPROB])], [Logprobs([LOGPROB, LOGPROB]), Thinking("x")], [LENGTH]],
        [
            [text("Hi"), text("", logprobs=legacy(["Hi"], [0]))],
            [text("", logprobs=legacy(["Hi", "Hi"], [2, 4])), text("")],
            [text("", "length")],
        ],
    ),
]


@pytest.mark.parametrize(("usage", "batches", "expected"), COMPLETION_STREAMS)
def test_completion_stream_events_become_chunks(usage, batches, expected):
    chunks = CompletionChunks(HEAD, usage)
    assert [chunks.batch(batch) for batch in batches] == expected


WHOLE_CHATS = [
    (
        Reply("Hello", "", [], DONE, []),
        False,
        {"role": "assistant", "content": "Hello"},
        None,
        "stop",
    ),
    (
        Reply("", "hmm", [CALL], DONE, [LOGPROB]),
        True,
        {
            "role": "assistant",
            "content": None,
            "reasoning": "hmm",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        },
        {"content": [LOGPROB]},
        "tool_calls",
    ),
    (
        Reply("Hel", "", [], LENGTH, []),
        False,
        {"role": "assistant", "content": "Hel"},
        None,
        "length",
    ),
]


@pytest.mark.parametrize(("reply", "logprobs", "message", "choice_logprobs", "finish"), WHOLE_CHATS)
def test_a_finished_chat_is_one_completion(reply, logprobs, message, choice_logprobs, finish):
    value = chat_completion(HEAD, reply, logprobs)
    choice = {"index": 0, "message": message, "logprobs": choice_logprobs, "finish_reason": finish}
    expected = {**HEAD, "object": "chat.completion", "choices": [choice], "usage": USAGE}
    assert value == expected
    assert json.dumps(value) == json.dumps(expected)  # the keys in OpenAI's order


@pytest.mark.parametrize(
    ("reply", "logprobs", "expected_logprobs", "finish"),
    [
        (Reply("Hi", "", [], DONE, [LOGPROB]), False, None, "stop"),
        (
            Reply("Hi", "", [], Finished("cancel", 4, 0, 2, 0, 0, 0, []), [LOGPROB]),
            True,
            legacy(["Hi"], [0]),
            "stop",
        ),
    ],
)
def test_a_finished_completion_is_one_text_completion(reply, logprobs, expected_logprobs, finish):
    choice = {"index": 0, "text": "Hi", "logprobs": expected_logprobs, "finish_reason": finish}
    expected = {**HEAD, "object": "text_completion", "choices": [choice], "usage": USAGE}
    value = text_completion(HEAD, reply, logprobs)
    assert json.dumps(value) == json.dumps(expected)


def test_embeddings_are_written_as_the_runner_encoded_them():
    result = Embedded(["[0.1]", '"AAAA"'], prompt_eval_count=3, load_duration=5, total_duration=9)
    assert "".join(json_pieces(embeddings_body("m", result), COMPACT)) == (
        '{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]},'
        '{"object":"embedding","index":1,"embedding":"AAAA"}],"model":"m",'
        '"usage":{"prompt_tokens": 3, "total_tokens": 3}}'
    )
