"""Objects with an empty ``properties`` are closed, and ``\\u`` escapes never
write a lone surrogate (issue 24, items 3 and 2).

LangChain sends a tool without arguments as ``{"properties": {}, "type":
"object"}`` and calls ``f(**args)``: the grammar allows only ``{}`` there,
in a ``format`` and in a forced tool call alike. A ``\\u`` escape of a
surrogate would give ``json.loads`` a lone surrogate, or a pair the grammar
counted as two characters where Python counts one."""

from __future__ import annotations

import json

import pytest
from grammar_probe import GrammarProbe

from jupyter_llm.api.structured import parse_format
from jupyter_llm.chat_formats import detect_format, read_template
from jupyter_llm.chat_formats.tool_grammar import tool_grammar
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

NO_ARGUMENTS = {"properties": {}, "type": "object"}  # as LangChain sends it


@pytest.fixture(scope="module")
def probe(demo_gguf):
    probe = GrammarProbe(demo_gguf)
    yield probe
    probe.close()


# (schema, accepted, refused)
OBJECTS = [
    (NO_ARGUMENTS, ["{}", "{ }"], ['{"a": 1}', '{"properties": {}, "type": "object"}', "[]"]),
    ({"properties": {}}, ["{}"], ['{"a": 1}']),  # no "type": properties make it an object
    ({"type": "object", "properties": {}, "required": []}, ["{}"], ['{"a": 1}']),
    ({**NO_ARGUMENTS, "additionalProperties": False}, ["{}"], ['{"a": 1}']),
    ({**NO_ARGUMENTS, "additionalProperties": True}, ["{}", '{"a": 1}'], ["[]"]),
    ({**NO_ARGUMENTS, "additionalProperties": {}}, ["{}", '{"a": [1]}'], ["[]"]),
    (
        {**NO_ARGUMENTS, "additionalProperties": {"type": "integer"}},
        ["{}", '{"a": 1}'],
        ['{"a": "x"}'],
    ),
    ({"type": "object"}, ["{}", '{"a": 1}'], ["[]"]),  # no properties at all: any object
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, ["{}", '{"a": 1}'],
     ['{"b": 1}']),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "accepted", "refused"), OBJECTS, ids=json.dumps)
def test_objects_are_closed_unless_additional_properties_opens_them(
    probe, schema, accepted, refused
):
    grammar = parse_format(schema).grammar
    for text in accepted:
        assert probe.accepts(grammar, text), (text, grammar)
    for text in refused:
        assert not probe.accepts(grammar, text), (text, grammar)


# (schema, accepted, refused): the escapes as written in a JSON string
ESCAPES = [
    ("json", ['{"a": "\\u00e9"}', '{"a": "\\uD7FF\\uE000\\uffff"}', '{"a": "\\ud83d\\ude00"}'],
     ['{"a": "\\ud800"}', '{"a": "\\uDFFF"}', '{"a": "\\ude00\\ud83d"}', '{"a": "\\ud83d"}',
      '{"a": "\\ud83d\\u0041"}', '{"a": "\\ud83d\\ud83d"}']),
    # a pair is one character, as json.loads counts it
    ({"type": "string", "maxLength": 1}, ['"\\u00e9"', '"\\ud83d\\ude00"', '"😀"'],
     ['"\\ud800"', '"\\udc00"', '"ab"']),
    ({"type": "string", "minLength": 2}, ['"\\ud83d\\ude00x"', '"😀😀"'],
     ['"\\ud83d\\ude00"', '"\\ud83dx"']),
    # keys of extra properties too (other_key writes its own escapes)
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
     ['{"\\u00e9": 1}', '{"a": 1, "\\ud83d\\ude00": 2}'], ['{"\\udc00": 1}', '{"a\\ud800": 1}']),
    # a pattern's characters: a surrogate is not one
    ({"type": "string", "pattern": "^.$"}, ['"é"', '"😀"'], ['"\\ud800"']),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "accepted", "refused"), ESCAPES, ids=json.dumps)
def test_an_escape_never_writes_a_lone_surrogate(probe, fmt, accepted, refused):
    grammar = parse_format(fmt).grammar
    for text in accepted:
        assert probe.accepts(grammar, text), (text, grammar)
        value = json.loads(text)  # and Python reads what the grammar counted
        if isinstance(fmt, dict) and fmt.get("type") == "string":
            assert fmt.get("minLength", 0) <= len(value) <= fmt.get("maxLength", len(value))
    for text in refused:
        assert not probe.accepts(grammar, text), (text, grammar)


QWEN = read_template("Qwen-Qwen2.5-7B-Instruct")


@pytest.mark.parametrize(
    ("parameters", "arguments", "allowed"),
    [
        (NO_ARGUMENTS, {}, True),
        (NO_ARGUMENTS, {"properties": {}, "type": "object"}, False),
        (NO_ARGUMENTS, {"x": 1}, False),
        (None, {}, True),  # no parameters: no arguments (OpenAI's reading)
        (None, {"x": 1}, False),
        ({}, {"x": 1}, False),
        ({"type": "object"}, {"x": 1}, True),  # an object said to be any object
        ({**NO_ARGUMENTS, "additionalProperties": True}, {"x": 1}, True),
    ],
)
def test_a_forced_call_of_a_tool_without_arguments_takes_none(
    probe, parameters, arguments, allowed
):
    function = {"name": "ping", "description": "Ping"}
    if parameters is not None:
        function["parameters"] = parameters
    built = tool_grammar(detect_format(QWEN), [{"type": "function", "function": function}], "ping")
    assert built is not None and not built.lazy
    call = {"name": "ping", "arguments": arguments}
    assert probe.accepts(built.grammar, f"<tool_call>{json.dumps(call)}</tool_call>") is allowed


@pytest.fixture
def qwen_model(models_dir, tmp_path_factory):
    spec = DemoModelSpec(chat_template=QWEN, context_length=4096)
    path = write_demo_model(tmp_path_factory.mktemp("qwen") / "qwen.gguf", spec)
    store = ModelStore(models_dir)
    store.create("qwen", {"qwen.gguf": store.add_blob_from_file(path)})
    return "qwen"


async def test_a_forced_tool_without_arguments_is_called_with_none(openai_client, qwen_model):
    tool = {"type": "function", "function": {"name": "ping", "parameters": NO_ARGUMENTS}}
    r = await openai_client.chat.completions.create(
        model=qwen_model,
        messages=[{"role": "user", "content": "Ping the server."}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "ping"}},
        max_tokens=200,
        temperature=1.0,
        seed=7,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "ping"
    assert call.function.arguments == "{}"
