"""The one option table and the one message validator, both APIs, as tables."""

import math

import pytest

from jupyter_llm.request.messages import parse_messages
from jupyter_llm.request.options import (
    DEFAULT_OPTIONS,
    DEFAULT_SAMPLING,
    OPENAI_FIELDS,
    OPTION_TYPES,
    SAMPLING_OPTIONS,
    openai_options,
    parse_options,
    split_options,
)

# The Ollama values below are from github.com/ollama/ollama at commit fb30760
# (2026-08-21): api/types.go DefaultOptions() and openai/openai.go.


@pytest.mark.parametrize(
    ("name", "ollama"),
    [
        ("num_predict", -1),  # api/types.go DefaultOptions(): NumPredict: -1
        ("num_keep", 4),  # api/types.go DefaultOptions(): NumKeep: 4
        ("temperature", 0.8),  # api/types.go DefaultOptions(): Temperature: 0.8
        ("top_k", 40),  # api/types.go DefaultOptions(): TopK: 40
        ("top_p", 0.9),  # api/types.go DefaultOptions(): TopP: 0.9
        ("min_p", 0.0),  # api/types.go DefaultOptions(): MinP not set, Go's zero value
        ("typical_p", 1.0),  # api/types.go DefaultOptions(): TypicalP: 1.0
        ("repeat_last_n", 64),  # api/types.go DefaultOptions(): RepeatLastN: 64
        ("repeat_penalty", 1.0),  # api/types.go DefaultOptions(): RepeatPenalty: 1.0
        ("presence_penalty", 0.0),  # api/types.go DefaultOptions(): PresencePenalty: 0.0
        ("frequency_penalty", 0.0),  # api/types.go DefaultOptions(): FrequencyPenalty: 0.0
        ("seed", -1),  # api/types.go DefaultOptions(): Seed: -1 (random)
        ("stop", []),  # api/types.go DefaultOptions(): Stop not set (nil)
        ("mirostat", 0),  # not in Ollama any more; llama.cpp's default: off
    ],
)
def test_defaults_are_ollamas(name, ollama):
    assert DEFAULT_OPTIONS[name] == ollama
    assert type(DEFAULT_OPTIONS[name]) is type(ollama)


def test_the_runner_defaults_every_sampling_option_from_the_table():
    from jupyter_llm.runner import engine

    assert engine.DEFAULT_SAMPLING is DEFAULT_SAMPLING
    assert set(DEFAULT_SAMPLING) == set(SAMPLING_OPTIONS)
    assert all(DEFAULT_SAMPLING[k] == DEFAULT_OPTIONS[k] for k in DEFAULT_SAMPLING)


@pytest.mark.parametrize(
    ("body", "option", "ollama"),
    [
        ({}, "temperature", 1.0),  # openai/openai.go: temperature 1.0 unless given
        ({}, "top_p", 1.0),  # openai/openai.go: top_p 1.0 unless given
        ({"temperature": 0.2}, "temperature", 0.2),  # openai/openai.go: as given
        ({"top_p": 0.5}, "top_p", 0.5),  # openai/openai.go: as given
        ({"max_tokens": 7}, "num_predict", 7),  # openai/openai.go: MaxTokens -> num_predict
        ({"seed": 3}, "seed", 3),  # openai/openai.go: Seed -> seed
        ({"stop": "x"}, "stop", ["x"]),  # openai/openai.go: a stop string becomes a list
        ({"stop": ["a", "b"]}, "stop", ["a", "b"]),  # openai/openai.go: a list as given
        ({"frequency_penalty": 1}, "frequency_penalty", 1),  # openai/openai.go: as given
        ({"presence_penalty": 1}, "presence_penalty", 1),  # openai/openai.go: as given
    ],
)
def test_openai_mapping_is_ollamas(body, option, ollama):
    assert openai_options(body)[option] == ollama


@pytest.mark.parametrize("option", ["repeat_penalty", "num_predict", "seed", "top_k", "stop"])
def test_openai_leaves_the_rest_to_the_model_and_the_defaults(option):
    """openai/openai.go sets only the fields the request names, plus
    temperature and top_p: a model's own repeat_penalty still applies."""
    assert option not in openai_options({})


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
        ({"num_predict": 100.0}, {"num_predict": 100}),  # integral, as Python may write it
        ({"draft_num_predict": 4}, {"draft_num_predict": 4}),
        ({"bogus": 1, "numa": False, "top_k": 3}, {"top_k": 3}),  # unknown: ignored
    ],
)
def test_options_accepted(raw, expected):
    assert parse_options(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "options must be an object"),
        ({"bogus": 1, "top_k": "many"}, "options.top_k must be an integer"),
        ({"temperature": "hot"}, "options.temperature must be a number"),
        ({"temperature": True}, "options.temperature must be a number"),
        ({"temperature": -1}, "options.temperature must be at least 0, got -1"),
        ({"temperature": math.nan}, "options.temperature must be a number, got NaN"),
        ({"num_predict": 1.5}, "options.num_predict must be an integer"),
        ({"num_predict": 1e300}, "options.num_predict must be an integer"),
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


def test_unknown_options_are_named_once(caplog):
    options, unknown = split_options({"numa": True, "temperature": 0, "x\n": 1, "tfs_z": 1})
    assert options == {"temperature": 0}
    assert unknown == ["numa", "'x\\n'", "tfs_z"]
    with caplog.at_level("WARNING", logger="jupyter_llm.request.options"):
        parse_options({"numa": True, "penalize_newline": True}, "parameters")
    assert [r.getMessage() for r in caplog.records] == [
        "parameters: ignoring unknown options: numa, penalize_newline"
    ]


def test_the_warning_stays_one_short_line(caplog):
    raw = {f"x{i}": 1 for i in range(10_000)} | {"y" * 1000: 1}
    with caplog.at_level("WARNING", logger="jupyter_llm.request.options"):
        assert parse_options(raw) == {}
    [record] = caplog.records
    assert record.getMessage().endswith("x19 and 9981 more")
    assert len(record.getMessage()) < 400


def test_known_options_warn_nothing(caplog):
    with caplog.at_level("WARNING", logger="jupyter_llm.request.options"):
        parse_options({"temperature": 0, "draft_num_predict": 2})
    assert caplog.records == []


def test_every_openai_field_maps_to_a_known_option():
    assert {f.option for f in OPENAI_FIELDS.values()} <= set(OPTION_TYPES)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, {"temperature": 1.0, "top_p": 1.0}),
        ({"temperature": 0, "seed": 3}, {"temperature": 0, "seed": 3, "top_p": 1.0}),
        ({"stop": "x"}, {"stop": ["x"], "temperature": 1.0, "top_p": 1.0}),
        ({"max_tokens": 5}, {"num_predict": 5, "temperature": 1.0, "top_p": 1.0}),
        (
            {"max_completion_tokens": 4, "max_tokens": 9},
            {"num_predict": 4, "temperature": 1.0, "top_p": 1.0},
        ),
        ({"presence_penalty": -2}, {"presence_penalty": -2, "temperature": 1.0, "top_p": 1.0}),
        ({"n": 1, "top_p": 0.5}, {"top_p": 0.5, "temperature": 1.0}),
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
KEPT_CALL = [{"type": "function", "function": {"name": "f", "arguments": {}}}]


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
            [{"role": "assistant", "content": "", "tool_calls": KEPT_CALL}],
        ),
        ([{"role": "tool", "content": "42"}], True, [{"role": "tool", "content": "42"}]),
        ([{"role": "developer", "content": "be"}], True, [{"role": "system", "content": "be"}]),
        ([{"role": "developer", "content": "be"}], False, [{"role": "system", "content": "be"}]),
        # Ollama lowercases a role (api/types.go Message.UnmarshalJSON)
        ([{"role": "User", "content": "hi"}], False, [{"role": "user", "content": "hi"}]),
        ([{"role": "ASSISTANT", "content": "a"}], True, [{"role": "assistant", "content": "a"}]),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}],
            True,
            [{"role": "user", "content": "a"}],
        ),
        (
            [{"role": "assistant", "content": "x", "tool_calls": TOOL_CALL}],
            True,  # the history of a tool call is kept for the template (issue 13)
            [{"role": "assistant", "content": "x", "tool_calls": KEPT_CALL}],
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
        (
            [{"role": "bot"}],
            False,
            "messages[0].role must be one of system, user, assistant, tool, developer",
        ),
        ([{"role": ["user"]}], False, "messages[0].role must be one of"),
        ([{"role": "user", "content": 3}], False, "messages[0].content must be a string"),
        ([{"role": "user", "content": [{"type": "text", "text": "a"}]}], False, "content must"),
        (None, True, "messages must be a non-empty list"),
        ([], True, "messages must be a non-empty list"),
        ([{"role": "bot"}], True, "role must be one of system, user, assistant, tool, developer"),
        ([{"role": "Bot"}], False, "role must be one of system, user, assistant, tool, developer"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], True, "must be a data: URL"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], True, "only text and image_url"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], True, "content[0].text"),
        ([{"role": "user", "content": 3}], True, "content must be a string or a list of parts"),
    ],
)
def test_messages_refused(raw, openai, message):
    with pytest.raises(ValueError) as info:
        parse_messages(raw, openai=openai)
    assert message in str(info.value)
