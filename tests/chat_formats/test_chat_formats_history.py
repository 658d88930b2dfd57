"""A tool round-trip in either API's history shape renders through every
real template that takes tools: the call and its result reach the prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_llm.chat_formats import ToolArguments, detect_format, template_messages
from jupyter_llm.runner.chat_template import ChatTemplate

TEMPLATES = Path(__file__).parents[2] / "jupyter_llm" / "chat_formats" / "templates"
WITH_TOOLS = sorted(
    p.stem
    for p in TEMPLATES.glob("*.jinja")
    if detect_format(p.read_text()).accepts_tools
    or detect_format(p.read_text()).tool_calls != "json"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city"}},
            "required": ["city"],
        },
    },
}
QUESTION = {"role": "user", "content": "What is the weather like there?"}
RESULT = "21 degrees and sunny"

OPENAI_HISTORY = [
    QUESTION,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc123", "content": RESULT},
]
OLLAMA_HISTORY = [
    QUESTION,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "tool_name": "get_weather", "content": RESULT},
]


def test_the_round_trip_covers_the_tool_templates():
    assert len(WITH_TOOLS) >= 13
    assert "google-gemma-2-2b-it" not in WITH_TOOLS


@pytest.mark.parametrize("history", [OPENAI_HISTORY, OLLAMA_HISTORY], ids=["openai", "ollama"])
@pytest.mark.parametrize("name", WITH_TOOLS)
def test_a_tool_round_trip_renders_through_each_real_template(name, history):
    source = (TEMPLATES / f"{name}.jinja").read_text()
    fmt = detect_format(source)
    messages = template_messages(history, fmt)
    prompt = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(messages, [WEATHER])
    assert RESULT in prompt
    assert "Paris" in prompt  # the call's arguments, which only the assistant turn holds
    tail = prompt[prompt.index("Paris") :]
    assert RESULT in tail  # the result comes after the call


def test_openai_calls_become_objects_and_results_are_matched_by_id():
    out = template_messages(OPENAI_HISTORY, detect_format(""))
    call = out[1]["tool_calls"][0]
    assert call == {
        "id": "call_abc123",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    assert out[1]["content"] == ""
    assert out[2] == {
        "role": "tool",
        "content": RESULT,
        "tool_call_id": "call_abc123",
        "name": "get_weather",
        "tool_name": "get_weather",
    }
    assert OPENAI_HISTORY[1]["content"] is None  # the request's own messages are left alone


def test_ollama_results_are_matched_by_name_and_given_the_call_id():
    out = template_messages(OLLAMA_HISTORY, detect_format(""))
    call_id = out[1]["tool_calls"][0]["id"]
    assert call_id == template_messages(OLLAMA_HISTORY, detect_format(""))[1]["tool_calls"][0]["id"]
    assert out[2]["tool_call_id"] == call_id


def test_results_without_id_or_name_follow_the_calls_in_order():
    history = [
        QUESTION,
        {
            "role": "assistant",
            "tool_calls": [
                {"function": {"name": "a", "arguments": {}}},
                {"function": {"name": "b", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "second"},
    ]
    out = template_messages(history, detect_format(""))
    assert [m.get("name") for m in out[2:]] == ["a", "b"]
    assert [m["tool_call_id"] for m in out[2:]] == [c["id"] for c in out[1]["tool_calls"]]
    assert len(out[1]["tool_calls"]) == 2  # matching did not eat the calls


def test_mistral_ids_are_nine_letters_or_digits_in_the_call_and_its_result():
    fmt = detect_format((TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text())
    out = template_messages(OPENAI_HISTORY, fmt)
    call_id = out[1]["tool_calls"][0]["id"]
    assert len(call_id) == 9 and call_id.isalnum()
    assert out[2]["tool_call_id"] == call_id
    kept = [
        {
            **OPENAI_HISTORY[1],
            "tool_calls": [{**OPENAI_HISTORY[1]["tool_calls"][0], "id": "a1b2c3d4e"}],
        }
    ]
    assert template_messages(kept, fmt)[0]["tool_calls"][0]["id"] == "a1b2c3d4e"


def test_tool_arguments_are_an_object_and_json_text():
    arguments = ToolArguments({"city": "Paris"})
    assert dict(arguments) == {"city": "Paris"}
    assert str(arguments) == '{"city": "Paris"}'
    assert "x" + arguments == 'x{"city": "Paris"}'
    assert json.loads(json.dumps(arguments)) == {"city": "Paris"}


def test_non_string_tool_results_are_json():
    history = [
        *OPENAI_HISTORY[:2],
        {"role": "tool", "tool_call_id": "call_abc123", "content": {"t": 21}},
    ]
    assert template_messages(history, detect_format(""))[2]["content"] == '{"t": 21}'


def test_thinking_is_given_under_both_names():
    out = template_messages(
        [{"role": "assistant", "content": "hi", "thinking": "hm"}], detect_format("")
    )
    assert (out[0]["thinking"], out[0]["reasoning_content"]) == ("hm", "hm")


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ("nope", r"messages\[1\].tool_calls must be a list"),
        ([{"name": "f"}], r"messages\[1\].tool_calls\[0\] must be an object with a function"),
        ([{"function": {"arguments": {}}}], r"tool_calls\[0\].function.name must be"),
        (
            [{"function": {"name": "f", "arguments": "{oops"}}],
            r"function.arguments must be an object",
        ),
        ([{"function": {"name": "f", "arguments": [1]}}], r"function.arguments must be an object"),
    ],
)
def test_a_malformed_tool_call_in_the_history_is_a_clear_error(calls, message):
    with pytest.raises(ValueError, match=message):
        template_messages([QUESTION, {"role": "assistant", "tool_calls": calls}], detect_format(""))


def test_a_malformed_tool_result_reference_is_a_clear_error():
    with pytest.raises(ValueError, match=r"messages\[2\].tool_call_id must be a string"):
        template_messages(
            [*OPENAI_HISTORY[:2], {"role": "tool", "tool_call_id": 5, "content": "x"}],
            detect_format(""),
        )
