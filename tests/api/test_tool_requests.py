"""Tools, tool choice and thinking as the handlers read them, table-driven."""

import pytest

from jupyter_llm.api.ollama_shapes import chat_call
from jupyter_llm.api.requests import (
    reasoning_field,
    think_field,
    tool_choice_field,
    tools_field,
)
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.messages import parse_messages

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "call, openai",
    [
        # Ollama: arguments as an object
        ({"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}, False),
        # OpenAI: arguments as JSON text, with an id
        (
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            True,
        ),
    ],
)
def test_tool_calls_in_history_take_one_shape(call, openai):
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None if openai else "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"},
    ]
    messages = parse_messages(history, openai=openai)
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert messages[2] == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "call_1",
        "tool_name": "get_weather",
    }


def test_a_participant_name_is_not_a_tool_name():
    messages = parse_messages([{"role": "user", "content": "hi", "name": "ann"}], openai=True)
    assert messages == [{"role": "user", "content": "hi"}]


def test_thinking_in_history_is_kept_under_either_name():
    ollama = parse_messages([{"role": "assistant", "content": "4", "thinking": "2+2"}])
    openai = parse_messages(
        [{"role": "assistant", "content": "4", "reasoning_content": "2+2"}], openai=True
    )
    assert ollama[0]["thinking"] == openai[0]["thinking"] == "2+2"


@pytest.mark.parametrize(
    "calls, match",
    [
        ("x", "tool_calls must be a list"),
        ([{"function": "f"}], r"tool_calls\[0\].function must be an object"),
        ([{"function": {"name": ""}}], "name must be a non-empty string"),
        ([{"function": {"name": "f", "arguments": "{nope"}}], "must be a JSON object"),
        ([{"function": {"name": "f", "arguments": [1]}}], "must be a JSON object"),
        ([{"id": 3, "function": {"name": "f"}}], r"tool_calls\[0\].id must be a string"),
    ],
)
def test_bad_tool_calls_name_the_field(calls, match):
    with pytest.raises(ValueError, match=match):
        parse_messages([{"role": "assistant", "content": "", "tool_calls": calls}])


@pytest.mark.parametrize(
    "value, expected",
    [(None, None), (True, True), (False, False), ("low", "low"), ("high", "high"), ("max", "max")],
)
def test_think(value, expected):
    assert think_field(value) == expected


@pytest.mark.parametrize("value", ["yes", 1, "minimal", "High", {}])
def test_bad_think(value):
    with pytest.raises(InvalidRequest, match="think must be"):
        think_field(value)


@pytest.mark.parametrize(
    "body, expected",
    [
        ({}, None),
        ({"reasoning_effort": "medium"}, "medium"),
        ({"reasoning_effort": "none"}, False),  # as Ollama maps it
        ({"reasoning": {"effort": "high"}}, "high"),
        # OpenAI's efforts past our ends, and a client's own tier, clamped as Ollama clamps
        ({"reasoning_effort": "minimal"}, "low"),
        ({"reasoning_effort": "max"}, "max"),
        ({"reasoning_effort": "xhigh"}, "max"),
        ({"reasoning": {"effort": "ultra"}}, "max"),
    ],
)
def test_reasoning_effort(body, expected):
    assert reasoning_field(body) == expected


@pytest.mark.parametrize("effort", ["extreme", ["x"], {}, 3])
def test_bad_reasoning_effort(effort):  # a list or an object: a 400, not a TypeError's 500
    with pytest.raises(InvalidRequest, match="reasoning_effort must be"):
        reasoning_field({"reasoning_effort": effort})


@pytest.mark.parametrize(
    "choice, expected",
    [
        (None, None),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "function": {"name": "get_weather"}}, {"name": "get_weather"}),
    ],
)
def test_tool_choice(choice, expected):
    assert tool_choice_field(choice, [WEATHER]) == expected


@pytest.mark.parametrize(
    "choice, match",
    [
        ("always", "tool_choice must be"),
        ({"type": "function", "function": {"name": "nope"}}, "not in tools"),
    ],
)
def test_bad_tool_choice(choice, match):
    with pytest.raises(InvalidRequest, match=match):
        tool_choice_field(choice, [WEATHER])


@pytest.mark.parametrize(
    "tools, match",
    [
        ("x", "tools must be a list"),
        ([1], r"tools\[0\].function must be an object"),
        ([{"function": {"name": 3}}], "name must be a non-empty string"),
        ([{"function": {"name": "f", "parameters": "x"}}], "parameters must be a JSON Schema"),
    ],
)
def test_bad_tools(tools, match):
    with pytest.raises(InvalidRequest, match=match):
        tools_field(tools)


def test_ollama_clients_send_tool_choice_in_options():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [WEATHER],
        "options": {"tool_choice": "get_weather", "temperature": 0},
    }
    req = chat_call(body).generation
    assert req.tool_choice == {"name": "get_weather"}
    assert req.options == {"temperature": 0}  # not a sampling option
    required = chat_call({**body, "options": {"tool_choice": "required"}}).generation
    assert required.tool_choice == "required"


def test_the_tool_calls_arguments_share_one_bound_on_values():
    """Each call's arguments are JSON text, a string in the body: alone
    each is within ``json_values``, but 3,000 of them held 6M values, and
    reading them took the server 6 s. Together they are bounded too."""
    import json

    from jupyter_llm.request.limits import JSON_VALUES
    from jupyter_llm.request.messages import parse_messages
    from jupyter_llm.request.untrusted_json import Refused

    arguments = json.dumps({"a": list(range(1999))})  # 2,001 values

    def chat(calls: int) -> list[dict]:
        call = {"type": "function", "function": {"name": "f", "arguments": arguments}}
        turn = {"role": "assistant", "content": "", "tool_calls": [call]}
        return [{"role": "user", "content": "hi"}, *[turn] * calls]

    within = JSON_VALUES.value // 2001
    assert len(parse_messages(chat(within), openai=True)) == within + 1
    with pytest.raises(Refused, match="json_values"):
        parse_messages(chat(within + 1), openai=True)
