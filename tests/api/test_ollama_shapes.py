"""Ollama's translations as tables: bodies into one generation request, a
finished generation and its stream of events into Ollama's values."""

from __future__ import annotations

import base64
import io
import re

import pytest
from generation_fields import fields
from PIL import Image

from jupyter_llm.api.base import COMPACT, json_pieces
from jupyter_llm.api.generation import Embedded, Finished, Logprobs, Reply, Thinking, ToolCalls
from jupyter_llm.api.ollama_shapes import (
    ChatEncoder,
    GenerateEncoder,
    chat_call,
    create_call,
    embed_body,
    embedding_body,
    format_parameters,
    generate_call,
)
from jupyter_llm.request.errors import InvalidRequest


def png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


PNG = png()
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
USER = {"role": "user", "content": "Hi"}
# (body, the request's fields that are set, stream, only_load)
GENERATE = [
    ({"model": "m", "prompt": "Hi"}, {"messages": [USER]}, True, False),
    (
        {"model": "m", "prompt": "Hi", "system": "Be brief.", "images": [PNG]},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {**USER, "images": [PNG]},
            ]
        },
        True,
        False,
    ),
    ({"model": "m", "prompt": "Hi", "raw": True}, {"prompt": "Hi"}, True, False),
    (
        {"model": "m", "prompt": "def f(", "suffix": "    return x"},
        {"prompt": "def f(", "suffix": "    return x"},
        True,
        False,
    ),
    (
        {"model": "m", "prompt": "Hi", "system": "S", "template": "{{ .System }}|{{ .Prompt }}"},
        {"prompt": "S|Hi"},
        True,
        False,
    ),
    (
        {"model": "m", "prompt": "Hi", "template": "", "suffix": ""},
        {"messages": [USER]},
        True,
        False,
    ),
    ({"model": "m"}, {"messages": [{"role": "user", "content": ""}]}, True, True),
    (
        {"model": "m", "keep_alive": 0},
        {"messages": [{"role": "user", "content": ""}], "keep_alive": 0},
        True,
        True,
    ),
    (
        {
            "model": "m",
            "prompt": "Hi",
            "stream": False,
            "keep_alive": "5m",
            "context": [1, 2],
            "options": {"temperature": 0, "num_ctx": 64},
            "format": "json",
            "think": "high",
            "logprobs": True,
            "top_logprobs": 3,
            "truncate": False,
            "shift": False,
        },
        {
            "messages": [USER],
            "keep_alive": 300.0,
            "context": [1, 2],
            "options": {"temperature": 0, "num_ctx": 64},
            "format": "set",
            "think": "high",
            "logprobs": 3,
            "truncate": False,
            "shift": False,
        },
        False,
        False,
    ),
    (
        {"model": "m", "prompt": "Hi", "logprobs": True},
        {"messages": [USER], "logprobs": 0},
        True,
        False,
    ),
    ({"model": "m", "prompt": "Hi", "top_logprobs": 2}, {"messages": [USER]}, True, False),
]


@pytest.mark.parametrize(("body", "expected", "stream", "only_load"), GENERATE)
def test_a_generate_body_is_one_generation_request(body, expected, stream, only_load):
    call = generate_call(body)
    assert fields(call) == expected
    assert (call.stream, call.only_load) == (stream, only_load)


CHAT = [
    ({"model": "m", "messages": [USER]}, {"messages": [USER]}, True, False),
    ({"model": "m", "messages": []}, {"messages": []}, True, True),
    ({"model": "m"}, {"messages": []}, True, True),
    (
        {"model": "m", "messages": [USER], "tools": [TOOL], "tool_choice": "required"},
        {"messages": [USER], "tools": [TOOL], "tool_choice": "required"},
        True,
        False,
    ),
    (  # Ollama's clients pass a tool's name through options
        {
            "model": "m",
            "messages": [USER],
            "tools": [TOOL],
            "options": {"tool_choice": "get_weather", "seed": 1},
        },
        {
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": {"name": "get_weather"},
            "options": {"seed": 1},
        },
        True,
        False,
    ),
    (
        {"model": "m", "messages": [USER], "stream": False, "think": False},
        {"messages": [USER], "think": False},
        False,
        False,
    ),
]


@pytest.mark.parametrize(("body", "expected", "stream", "only_load"), CHAT)
def test_a_chat_body_is_one_generation_request(body, expected, stream, only_load):
    call = chat_call(body)
    assert fields(call) == expected
    assert (call.stream, call.only_load) == (stream, only_load)


# (translation, body, the 400's message): the first bad field is the one named
BAD = [
    (generate_call, {"prompt": "x"}, "model is required and must be a non-empty string"),
    (generate_call, {"model": "m", "context": "x"}, "context must be a list of token ids"),
    (generate_call, {"model": "m", "context": [-1]}, "context must be a list of token ids ("),
    (generate_call, {"model": "m", "context": [True]}, "context must be a list of token ids ("),
    (generate_call, {"model": "m", "stream": "yes"}, "stream must be a boolean"),
    (
        generate_call,
        {"model": "m", "options": {"temperature": "hot"}},
        "options.temperature must be a number",
    ),
    (generate_call, {"model": "m", "keep_alive": "soon"}, "keep_alive"),
    (generate_call, {"model": "m", "format": "yaml"}, 'invalid format: "yaml"'),
    (generate_call, {"model": "m", "think": "very"}, "think"),
    (generate_call, {"model": "m", "logprobs": 1}, "logprobs must be a boolean"),
    (
        generate_call,
        {"model": "m", "top_logprobs": 21},
        "top_logprobs must be an integer between 0 and 20",
    ),
    (generate_call, {"model": "m", "truncate": 0}, "truncate must be a boolean"),
    (generate_call, {"model": "m", "shift": "no"}, "shift must be a boolean"),
    (generate_call, {"model": "m", "prompt": 3}, "prompt must be a string"),
    (generate_call, {"model": "m", "system": 3}, "system must be a string"),
    (generate_call, {"model": "m", "raw": 1}, "raw must be a boolean"),
    (generate_call, {"model": "m", "template": []}, "template must be a string"),
    (generate_call, {"model": "m", "suffix": 1}, "suffix must be a string"),
    (generate_call, {"model": "m", "images": "x"}, "images must be a list of base64 strings"),
    (generate_call, {"model": "m", "prompt": "x", "template": "{{ .Nope }}"}, "template uses"),
    (generate_call, {"model": "m", "stream": 1, "context": "x"}, "context must be"),
    (
        chat_call,
        {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
        "messages[0].role",
    ),
    (chat_call, {"model": "m", "messages": "x"}, "messages"),
    (chat_call, {"model": "m", "tools": "x"}, "tools must be a list"),
    (
        chat_call,
        {"model": "m", "tools": [TOOL], "tool_choice": "other"},
        "tool_choice names 'other'",
    ),
    (chat_call, {"model": "m", "tool_choice": "x", "messages": "x"}, "messages"),
]


@pytest.mark.parametrize(("translate", "body", "message"), BAD)
def test_a_bad_field_is_a_400_naming_it(translate, body, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        translate(body)


DONE = Finished("stop", 4, 40, 2, 20, 5, 100, [7, 8])
TIMES = {
    "total_duration": 100,
    "load_duration": 5,
    "prompt_eval_count": 4,
    "prompt_eval_duration": 40,
    "eval_count": 2,
    "eval_duration": 20,
}
CALL = {"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}}
CALLED = {
    "id": "c1",
    "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}},
}
LOGPROB = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
G = {"model": "m", "created_at": "T"}

# batches of events -> the NDJSON values, for /api/generate and /api/chat
STREAMS = [
    (
        GenerateEncoder,
        [["Hel", "lo"], [DONE]],
        [
            [{**G, "response": "Hel", "done": False}, {**G, "response": "lo", "done": False}],
            [
                {
                    **G,
                    "response": "",
                    "done": True,
                    "done_reason": "stop",
                    **TIMES,
                    "context": [7, 8],
                }
            ],
        ],
    ),
    (
        GenerateEncoder,
        [[Thinking("hmm"), Logprobs([LOGPROB]), ToolCalls([CALL])]],
        [
            [
                {**G, "response": "", "thinking": "hmm", "done": False},
                {**G, "response": "", "logprobs": [LOGPROB], "done": False},
                {**G, "response": "", "done": False},
            ]
        ],
    ),
    (
        ChatEncoder,
        [["Hi", Thinking("hmm")], [ToolCalls([CALL]), ToolCalls([CALL, {"name": "f"}])], [DONE]],
        [
            [
                {**G, "message": {"role": "assistant", "content": "Hi"}, "done": False},
                {
                    **G,
                    "message": {"role": "assistant", "content": "", "thinking": "hmm"},
                    "done": False,
                },
            ],
            [
                {
                    **G,
                    "message": {"role": "assistant", "content": "", "tool_calls": [CALLED]},
                    "done": False,
                },
                {
                    **G,
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {**CALLED, "function": {**CALLED["function"], "index": 1}},
                            {"id": "", "function": {"index": 2, "name": "f", "arguments": {}}},
                        ],
                    },
                    "done": False,
                },
            ],
            [
                {
                    **G,
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": "stop",
                    **TIMES,
                }
            ],
        ],
    ),
    (
        ChatEncoder,
        [[Logprobs([LOGPROB])]],
        [
            [
                {
                    **G,
                    "message": {"role": "assistant", "content": ""},
                    "logprobs": [LOGPROB],
                    "done": False,
                }
            ]
        ],
    ),
]


@pytest.mark.parametrize(("encoder", "batches", "expected"), STREAMS)
def test_stream_events_become_ndjson_values(encoder, batches, expected):
    encode = encoder("m", now=lambda: "T")
    assert [encode.batch(batch) for batch in batches] == expected


REPLY = Reply("Hello", "hmm", [CALL], DONE, [LOGPROB])
WHOLE = [
    (
        GenerateEncoder,
        REPLY,
        False,
        {
            **G,
            "response": "Hello",
            "thinking": "hmm",
            "done": True,
            "done_reason": "stop",
            **TIMES,
            "context": [7, 8],
        },
    ),
    (
        GenerateEncoder,
        Reply("Hello", "", [], DONE, [LOGPROB]),
        True,
        {
            **G,
            "response": "Hello",
            "done": True,
            "done_reason": "stop",
            **TIMES,
            "context": [7, 8],
            "logprobs": [LOGPROB],
        },
    ),
    (
        ChatEncoder,
        REPLY,
        True,
        {
            **G,
            "message": {
                "role": "assistant",
                "content": "Hello",
                "thinking": "hmm",
                "tool_calls": [CALLED],
            },
            "done": True,
            "done_reason": "stop",
            **TIMES,
            "logprobs": [LOGPROB],
        },
    ),
]


@pytest.mark.parametrize(("encoder", "reply", "logprobs", "expected"), WHOLE)
def test_a_finished_generation_is_one_value(encoder, reply, logprobs, expected):
    value = encoder("m", now=lambda: "T").whole(reply, logprobs)
    assert value == expected
    assert list(value) == list(expected)  # the keys in Ollama's order


@pytest.mark.parametrize(
    ("encoder", "reason", "expected"),
    [
        (GenerateEncoder, "load", {**G, "response": "", "done": True, "done_reason": "load"}),
        (
            ChatEncoder,
            "unload",
            {
                **G,
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "unload",
            },
        ),
    ],
)
def test_nothing_to_generate_says_load_or_unload(encoder, reason, expected):
    assert encoder("m", now=lambda: "T").loaded(reason) == expected


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({}, ""),
        # Ollama's "%-30s %#v": the name in 30 columns, Go's form of each value
        ({"temperature": 0.5}, "temperature" + " " * 20 + "0.5"),
        ({"stop": ["a", "b"]}, "stop" + " " * 27 + '"a"\nstop' + " " * 27 + '"b"'),
    ],
)
def test_parameters_text(params, text):
    assert format_parameters(params) == text


CREATE_BAD = [
    ({}, "model is required and must be a non-empty string"),
    ({"model": "m", "template": 1}, "template must be a string"),
    ({"model": "m", "system": []}, "system must be a string"),
    ({"model": "m", "quantize": "q4_0"}, "quantize: quantizing is not supported here"),
    (
        {"model": "m", "from": "n", "adapters": {"a": "b"}},
        "adapters: LoRA adapters is not supported",
    ),
    ({"model": "m"}, "files is required (upload a GGUF with /api/blobs first), or from"),
    ({"model": "m", "from": "n", "parameters": {"temperature": "hot"}}, "parameters.temperature"),
    ({"model": "m", "from": "n", "messages": [{"role": "x"}]}, "messages[0].role"),
    (
        {"model": "m", "from": "n", "license": ["a", 1]},
        "license must be a string or a list of strings",
    ),
    ({"model": "m", "from": "n", "stream": "no"}, "stream must be a boolean"),
]


@pytest.mark.parametrize(("body", "message"), CREATE_BAD)
def test_a_bad_create_field_is_a_400_naming_it(body, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        create_call(body)


def test_a_create_body_names_its_text_layers():
    call = create_call(
        {"model": "m", "from": "n", "system": "S", "license": ["MIT", "GPL"], "stream": False}
    )
    assert (call.name.display, call.source.display, call.stream) == ("m:latest", "n:latest", False)
    assert call.texts() == {
        "template": None,
        "system": "S",
        "license[0]": "MIT",
        "license[1]": "GPL",
    }
    assert create_call({"model": "m", "files": {}, "license": "L"}).texts()["license"] == "L"


VECTORS = Embedded(
    vectors=["[0.1,0.2]", "[0.3,0.4]"], prompt_eval_count=3, load_duration=5, total_duration=9
)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (
            embed_body("m", VECTORS),
            '{"model":"m","embeddings":[[0.1,0.2],[0.3,0.4]],'
            '"total_duration":9,"load_duration":5,"prompt_eval_count":3}',
        ),
        (embedding_body(VECTORS), '{"embedding":[0.1,0.2]}'),
    ],
)
def test_embeddings_are_written_as_the_runner_encoded_them(body, text):
    assert "".join(json_pieces(body, COMPACT)) == text


@pytest.mark.parametrize("framing", ["NDJSON", "SSE", "NAMED_SSE"])
def test_a_value_encoded_in_pieces_is_the_same_text(framing):
    """A stream's large value is encoded off the loop a piece at a time: the
    same bytes as ``json.dumps`` writes, long strings and lists included."""
    from jupyter_llm.api import base

    frame = getattr(base, framing)
    value = {
        "type": "message_delta",
        "response": 'é"\\\n😀\x00' * 40_000,
        "context": list(range(30_000)),
        "logprobs": [{"token": "x", "logprob": -0.5, "bytes": [120]}] * 3_000,
        "done": True,
        "nested": {"a": [None, 1.5, "b"], "": {}},
    }
    assert frame.encode_in_pieces(value) == frame.encode(value)
