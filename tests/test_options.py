"""The one option table and the one message validator, both APIs, as tables."""

import math

import pytest

from jupyter_llm.messages import parse_messages
from jupyter_llm.options import OPENAI_FIELDS, OPTION_TYPES, openai_options, parse_options


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"temperature": 0.5, "num_ctx": 2048}, {"temperature": 0.5, "num_ctx": 2048}),
        ({"temperature": None}, {}),
        ({"stop": "x"}, {"stop": "x"}),
        ({"stop": ["a", "b"]}, {"stop": ["a", "b"]}),
        ({"use_mmap": False}, {"use_mmap": False}),
        ({"num_predict": -2, "top_p": 1}, {"num_predict": -2, "top_p": 1}),
    ],
)
def test_options_accepted(raw, expected):
    assert parse_options(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "options must be an object"),
        ({"bogus": 1}, "options.bogus is not a known option"),
        ({"temperature": "hot"}, "options.temperature must be a number"),
        ({"temperature": True}, "options.temperature must be a number"),
        ({"temperature": -1}, "options.temperature must be at least 0, got -1"),
        ({"temperature": math.nan}, "options.temperature must be a number, got NaN"),
        ({"num_predict": 1.5}, "options.num_predict must be an integer"),
        ({"num_predict": True}, "options.num_predict must be an integer"),
        ({"num_ctx": 0}, "options.num_ctx must be between 1 and 1048576, got 0"),
        ({"top_p": 1.5}, "options.top_p must be between 0 and 1, got 1.5"),
        ({"stop": [1]}, "options.stop must be a string or a list of strings"),
        ({"stop": True}, "options.stop must be a string or a list of strings"),
        ({"use_mmap": 1}, "options.use_mmap must be a boolean"),
    ],
)
def test_options_refused(raw, message):
    with pytest.raises(ValueError) as info:
        parse_options(raw)
    assert str(info.value) == message


def test_parameters_name_their_field():
    with pytest.raises(ValueError, match=r"^parameters\.bogus "):
        parse_options({"bogus": 1}, "parameters")


def test_every_openai_field_maps_to_a_known_option():
    assert {f.option for f in OPENAI_FIELDS.values()} <= set(OPTION_TYPES)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, {"temperature": 1.0, "repeat_penalty": 1.0}),
        ({"temperature": 0, "seed": 3}, {"temperature": 0, "seed": 3, "repeat_penalty": 1.0}),
        ({"stop": "x"}, {"stop": ["x"], "temperature": 1.0, "repeat_penalty": 1.0}),
        ({"max_tokens": 5}, {"num_predict": 5, "temperature": 1.0, "repeat_penalty": 1.0}),
        (
            {"max_completion_tokens": 4, "max_tokens": 9},
            {"num_predict": 4, "temperature": 1.0, "repeat_penalty": 1.0},
        ),
        ({"presence_penalty": -2}, {"presence_penalty": -2, "temperature": 1.0}),
        ({"n": 1, "top_p": 0.5}, {"top_p": 0.5, "temperature": 1.0, "repeat_penalty": 1.0}),
    ],
)
def test_openai_fields_become_options(body, expected):
    assert openai_options(body) == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": 3}, "temperature must be between 0 and 2, got 3"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"top_p": 2}, "top_p must be between 0 and 1, got 2"),
        ({"frequency_penalty": -3}, "frequency_penalty must be between -2 and 2, got -3"),
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"stop": [1]}, "stop must be a string or a list of strings"),
        ({"n": 2}, "n must be 1: one choice per request"),
    ],
)
def test_openai_fields_refused(body, message):
    with pytest.raises(ValueError) as info:
        openai_options(body)
    assert str(info.value) == message


TOOL_CALL = [{"function": {"name": "f", "arguments": {}}}]


@pytest.mark.parametrize(
    ("raw", "openai", "expected"),
    [
        (None, False, []),
        ([], False, []),
        ([{"role": "user", "content": "hi"}], False, [{"role": "user", "content": "hi"}]),
        ([{"role": "assistant"}], False, [{"role": "assistant", "content": ""}]),
        (
            [{"role": "assistant", "content": None, "tool_calls": TOOL_CALL}],
            False,
            [{"role": "assistant", "content": "", "tool_calls": TOOL_CALL}],
        ),
        ([{"role": "tool", "content": "42"}], True, [{"role": "tool", "content": "42"}]),
        ([{"role": "developer", "content": "be"}], True, [{"role": "system", "content": "be"}]),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}],
            True,
            [{"role": "user", "content": "a"}],
        ),
        (
            [{"role": "assistant", "content": "x", "tool_calls": TOOL_CALL}],
            True,
            [{"role": "assistant", "content": "x"}],
        ),
    ],
)
def test_messages_accepted(raw, openai, expected):
    assert parse_messages(raw, openai=openai) == expected


@pytest.mark.parametrize(
    ("raw", "openai", "message"),
    [
        ("hi", False, "messages must be a list of messages"),
        ([3], False, "messages[0] must be an object"),
        ([{"role": "bot"}], False, "messages[0].role must be one of system, user, assistant, tool"),
        ([{"role": ["user"]}], False, "messages[0].role must be one of"),
        ([{"role": "developer"}], False, "messages[0].role must be one of"),
        ([{"role": "user", "content": 3}], False, "messages[0].content must be a string"),
        ([{"role": "user", "content": [{"type": "text", "text": "a"}]}], False, "content must"),
        (None, True, "messages must be a non-empty list"),
        ([], True, "messages must be a non-empty list"),
        ([{"role": "bot"}], True, "role must be one of system, user, assistant, tool, developer"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], True, "only text parts"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], True, "content[0].text"),
        ([{"role": "user", "content": 3}], True, "content must be a string or a list of parts"),
    ],
)
def test_messages_refused(raw, openai, message):
    with pytest.raises(ValueError) as info:
        parse_messages(raw, openai=openai)
    assert message in str(info.value)
