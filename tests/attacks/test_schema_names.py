"""Attacks on what the grammar converter spells out and where it can fail:
names kilobytes long (a 256 KB schema with one 100 KB property name made a
1 GB grammar in 15 s; a 1 MB tool name a 541 MB one in the runner), a
pattern of a thousand nested groups (a RecursionError, so a 500), and tool
schemas whose grammar goes over its budget only once the runner spells it
out (an untyped runner error, so a 500). Each is now a bounded grammar or a
400 naming the field."""

from __future__ import annotations

import json

import pytest

from jupyter_llm.api.requests import tools_field
from jupyter_llm.api.structured import LIMITS, parse_format
from jupyter_llm.chat_formats import detect_format, read_template
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.runner.chat_plan import tools_grammar
from jupyter_llm.runner.protocol import InputError

QWEN = detect_format(read_template("Qwen-Qwen2.5-7B-Instruct"))


def objects(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties)}


def test_a_long_property_name_makes_a_grammar_of_the_schemas_size():
    inner = objects({f"p{i}": {"type": "integer"} for i in range(1500)})
    schema = objects({"n" * 100_000: inner})
    size = len(json.dumps(schema))
    assert size <= LIMITS.max_bytes
    assert len(parse_format(schema).grammar) < 4 * size


def test_long_names_nested_deep_make_a_grammar_of_the_schemas_size():
    schema = inner = objects({})
    for depth in range(30):
        child = objects({})
        inner["properties"] = {"m" * 3000 + str(depth): child}
        inner["required"] = list(inner["properties"])
        inner = child
    assert len(parse_format(schema).grammar) < len(json.dumps(schema))


def test_an_error_names_a_long_property_by_its_start():
    schema = objects({"n" * 100_000: {"type": "string", "pattern": "(" * 65 + ")" * 65}})
    with pytest.raises(InvalidRequest, match="schema_depth") as refused:
        parse_format(schema)
    assert len(str(refused.value)) < 500


def test_a_tool_name_over_its_limit_is_refused():
    def tool(name: str) -> dict:
        return {"type": "function", "function": {"name": name, "parameters": objects({})}}

    assert tools_field([tool("f" * 128)])
    with pytest.raises(InvalidRequest, match=r"tools\[0\]\.function\.name.*tool_name"):
        tools_field([tool("f" * 129)])


@pytest.mark.parametrize("where", ["pattern", "patternProperties"])
def test_a_pattern_of_a_thousand_nested_groups_is_a_400(where):
    deep = "(" * 1000 + "a" + ")" * 1000
    schema = (
        {"type": "string", "pattern": deep}
        if where == "pattern"
        else {"type": "object", "patternProperties": {deep: {}}}
    )
    with pytest.raises(InvalidRequest, match="nest"):
        parse_format(schema)
    tool = {"type": "function", "function": {"name": "f", "parameters": objects({"s": schema})}}
    if where == "pattern":  # the runner's converter reads it: refused before it gets there
        with pytest.raises(InvalidRequest, match="schema_depth"):
            tools_field([tool])


def test_tools_whose_grammar_outgrows_its_budget_in_the_runner_are_the_clients_error():
    # each $defs entry merges the one before it into both of its branches:
    # small to measure, twice as wide at every level once spelled out
    defs = {"a0": objects({"x": {"type": "integer"}})}
    for i in range(1, 16):
        before = {"$ref": f"#/$defs/a{i - 1}"}
        branches = [{"allOf": [before, objects({f"{k}{i}": {"type": "string"}})]} for k in "pq"]
        defs[f"a{i}"] = {"anyOf": branches}
    params = {"type": "object", "$defs": defs, "properties": {"v": {"$ref": "#/$defs/a15"}}}
    tools = tools_field([{"type": "function", "function": {"name": "f", "parameters": params}}])
    with pytest.raises(InputError, match=r"invalid tools: .*schema_alternatives"):
        tools_grammar(QWEN, tools, "required")
