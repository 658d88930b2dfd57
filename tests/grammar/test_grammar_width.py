"""Grammar width (issue 23, attack 6): enums as prefix trees, checked by
llama.cpp's own grammar engine to accept exactly the values they did as a
list of alternatives; the bounds on enum values, their characters and
anyOf/oneOf/type branches, for ``format`` and for tool parameters (one
grammar for all tools); and the converter's own budget for what a ``$ref``
or a merge spells out, in the server and in the runner's tool grammars."""

from __future__ import annotations

import json
import re

import pytest
from grammar_probe import GrammarProbe
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_llm.api.requests import tools_field
from jupyter_llm.api.structured import (
    LIMITS,
    SchemaLimits,
    check_tools,
    parse_format,
)
from jupyter_llm.chat_formats import detect_format, read_template
from jupyter_llm.chat_formats.tool_grammar import tool_grammar
from jupyter_llm.grammar.check import check_output
from jupyter_llm.grammar.gbnf import GrammarBudget, GrammarTooLarge, enum_expr, json_literal
from jupyter_llm.grammar.json_schema import schema_to_grammar
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import (
    ENUM_CHARS,
    ENUM_VALUES,
    SCHEMA_ALTERNATIVES,
    SCHEMA_REPEAT_CAP,
    TOOLS,
)


@pytest.fixture(scope="module")
def probe(demo_gguf):
    probe = GrammarProbe(demo_gguf)
    yield probe
    probe.close()


def near_misses(text: str) -> list[str]:
    """Strings one edit away from ``text``'s JSON: cut, extended, changed."""
    out = [text[:-1], text + "x", text + '"', text[1:]]
    for i in range(1, len(text) - 1):
        out.append(text[:i] + text[i + 1 :])  # one character dropped
        out.append(text[:i] + ("z" if text[i] != "z" else "y") + text[i + 1 :])
    return out


# -- the prefix tree ---------------------------------------------------------------------------
ENUMS = {
    "look-alikes": ["abc1", "abc2", "abd", "ab", "b"],
    "prefix of another": ["a", "ab", "abc", "abcd"],
    "numbers": [1, 12, 1.5, -1, 0, 10, 100],
    "mixed": ["red", "green", 3, None, True, False, {"k": [1, 2]}, [1, "a"], "", "3"],
    "escapes": ['say "hi"', "back\\slash", "tab\there", "new\nline", "ünï", "😀", "a/b"],
    "one": ["only"],
    "shared suffix": [f"value-{i:03d}-xxxxx" for i in range(0, 1000, 37)],
}


@pytest.mark.parametrize("values", ENUMS.values(), ids=ENUMS.keys())
def test_an_enum_accepts_its_values_and_nothing_near(probe, values):
    texts = {json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values}
    grammar = parse_format({"enum": values}).grammar
    for text in texts:
        assert probe.accepts(grammar, text), text
        for miss in near_misses(text):
            assert probe.accepts(grammar, miss) == (miss in texts), (text, miss)


def test_look_alikes_share_their_states():
    assert enum_expr(["abc1", "abc2", "abd"]) == r'"\"ab" ("c" ("1\"" | "2\"") | "d\"")'
    assert enum_expr([1, 12]) == '"1" ("2")?'
    assert enum_expr([]) is None


def test_consts_of_an_any_of_are_one_tree(probe):
    schema = {"anyOf": [{"const": "v-01"}, {"const": "v-02"}, {"enum": ["w", 3]}]}
    grammar = parse_format(schema).grammar
    assert grammar.count("v-0") == 1, grammar  # written once, for both
    for text, ok in [('"v-01"', True), ('"v-02"', True), ('"w"', True), ("3", True)]:
        assert probe.accepts(grammar, text) == ok
    assert not probe.accepts(grammar, '"v-03"')


def test_an_empty_enum_is_any_value_as_before_it_was_a_500(probe):
    grammar = parse_format({"type": "object", "properties": {"e": {"enum": []}}}).grammar
    assert probe.accepts(grammar, '{"e":[1]}')


ALPHABET = st.sampled_from(["a", "b", '"', "\\", "é", "1"])
VALUES = st.lists(st.text(ALPHABET, max_size=5), min_size=1, max_size=12, unique=True)


@settings(max_examples=60, deadline=None)
@given(values=VALUES, other=st.text(ALPHABET, max_size=5))
def test_the_tree_accepts_exactly_the_values(probe, values, other):
    grammar = schema_to_grammar({"enum": values})
    for value in values:
        assert probe.accepts(grammar, json.dumps(value, ensure_ascii=False))
    assert probe.accepts(grammar, json.dumps(other, ensure_ascii=False)) == (other in values)


def test_grammar_size_is_linear_in_the_characters():
    prefix = "shared-prefix-" * 8  # 112 characters every value starts with

    def sizes(n: int) -> tuple[int, int, int]:
        """The tree's grammar, the values' characters, the old list of alternatives."""
        values = [f"{prefix}{i:06d}" for i in range(n)]
        listed = len(" | ".join(json_literal(v) for v in values))
        return len(schema_to_grammar({"enum": values})), sum(map(len, values)), listed

    small, chars_small, _ = sizes(ENUM_VALUES.value // 2)
    large, chars_large, listed = sizes(ENUM_VALUES.value)
    assert chars_large == 2 * chars_small
    assert 1.8 <= large / small <= 2.2  # twice the values: twice the grammar, no more
    assert large <= chars_large / 4  # the shared prefix is written once
    assert large <= listed / 4


# -- the bounds, for format ---------------------------------------------------------------------
def refusal(schema, field: str = "format") -> str:
    with pytest.raises(InvalidRequest) as info:
        parse_format(schema, field)
    return str(info.value)


def looks(n: int) -> list[str]:
    return [f"value-{i:06d}-xxxxx" for i in range(n)]


@pytest.mark.parametrize(
    ("schema", "key"),
    [
        ({"enum": looks(ENUM_VALUES.value + 1)}, "enum_values"),
        (
            {"type": "object", "properties": {f"p{i}": {"const": i} for i in range(1001)}},
            "enum_values",
        ),
        ({"enum": ["x" * (ENUM_CHARS.value + 1)]}, "enum_chars"),
        ({"enum": [{"k": "x" * ENUM_CHARS.value}]}, "enum_chars"),
        (
            {"anyOf": [{"type": "string", "minLength": i} for i in range(257)]},
            "schema_alternatives",
        ),
        (
            {"properties": {f"p{i}": {"type": ["string", "null"]} for i in range(129)}},
            "schema_alternatives",
        ),
        (
            {"oneOf": [{"const": i} for i in range(SCHEMA_ALTERNATIVES.value + 1)]},
            "schema_alternatives",
        ),
    ],
    ids=["enum", "consts", "chars", "object chars", "anyOf", "type lists", "oneOf of consts"],
)
def test_width_over_a_limit_is_a_400_naming_field_and_limit(schema, key):
    message = refusal(schema)
    assert message.startswith("invalid format: ") and "format has " in message, message
    assert f"({key})" in message, message
    message = refusal(schema, "response_format")
    assert "response_format has " in message and f"({key})" in message, message


def at_the_limits() -> list[str]:
    """1000 look-alike values of 15 characters: at ENUM_VALUES and ENUM_CHARS."""
    values = [f"value-{i:06d}-xx" for i in range(ENUM_VALUES.value)]
    assert sum(map(len, values)) == ENUM_CHARS.value
    return values


def test_width_at_the_limits_is_accepted():
    parse_format({"enum": at_the_limits()})
    parse_format({"enum": ["x" * ENUM_CHARS.value]})
    parse_format({"anyOf": [{"type": "string", "minLength": i} for i in range(256)]})


def test_names_and_data_are_not_counted_as_keywords():
    # a property named "enum", an enum value that looks like a schema
    schema = {
        "type": "object",
        "properties": {
            "enum": {"type": "string"},
            "anyOf": {"type": "string"},
            "x": {"enum": [{"anyOf": list(range(300))}]},
        },
    }
    parse_format(schema)


def test_a_ref_anywhere_is_measured():
    # an enum under a key the converter ignores, reached by $ref
    message = refusal({"x": {"enum": looks(1001)}, "$ref": "#/x"})
    assert "(enum_values)" in message


# -- the converter's own budget ------------------------------------------------------------------
def test_counts_past_the_cap_are_open_wherever_they_are():
    # a $ref into a part bounded_schema does not walk, and additionalItems
    for schema in [
        {"x": {"type": "string", "maxLength": 2**31 - 1}, "$ref": "#/x"},
        {"items": [{"type": "integer"}], "additionalItems": {"type": "string", "minLength": 2**31}},
        {"type": "array", "items": {"type": "string", "pattern": "^a{2147483647}$"}},
    ]:
        grammar = parse_format(schema).grammar
        assert len(grammar) < 40 * SCHEMA_REPEAT_CAP
        assert not re.search(r"\d{5,}", grammar), grammar


def test_merges_that_multiply_are_refused_before_they_run_away():
    defs = {}
    for k in range(6):  # 16 branches, each merging the next level: 16**6 as written out
        below = {"$ref": f"#/$defs/l{k + 1}"} if k < 5 else {"type": "string"}
        defs[f"l{k}"] = {"anyOf": [{"allOf": [below], "minLength": i} for i in range(16)]}
    message = refusal({"$defs": defs, "$ref": "#/$defs/l0"})
    assert "(schema_alternatives)" in message and "grammar" in message


def test_the_budget_is_one_for_everything_built_with_it():
    budget = GrammarBudget(alternatives=10)
    schema_to_grammar({"anyOf": [{"type": "string"}, {"type": "integer"}] * 3}, budget)
    with pytest.raises(GrammarTooLarge, match="schema_alternatives"):
        schema_to_grammar({"anyOf": [{"type": "string"}, {"type": "number"}] * 3}, budget)


# -- tools ---------------------------------------------------------------------------------------
def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties}


@pytest.mark.parametrize(
    ("tools", "field", "key"),
    [
        ([tool("f", obj(c={"enum": looks(1001)}))], "tools[0].function.parameters", "enum_values"),
        (
            [tool("f", {"type": "object"}), tool("g", obj(c={"enum": ["x" * 15_001]}))],
            "tools[1].function.parameters",
            "enum_chars",
        ),
        (
            [tool("f", obj(u={"anyOf": [{"type": "string"}] * 300}))],
            "tools[0].function.parameters",
            "schema_alternatives",
        ),
        (
            [tool("f", json.loads('{"items": ' * 80 + "{}" + "}" * 80))],
            "tools[0].function.parameters",
            "schema_depth",
        ),
        (
            [tool("f", obj(**{f"p{i}": {"type": "string"} for i in range(300)}))],
            "tools[0].function.parameters at $",
            "schema_optional",
        ),
        (
            [tool("f", obj(s={"type": "string", "pattern": "a" * 5000}))],
            "tools[0].function.parameters at $.properties.s",
            "schema_pattern",
        ),
        (
            [tool("f", obj(s={"anyOf": [{"type": "string", "maxLength": 1000}] * 51}))],
            "tools[0].function.parameters",
            "schema_repeats",
        ),
        (
            [tool("f", obj(s={"enum": ["x" * 300_000]}))],
            "tools[0].function.parameters",
            "schema_bytes",
        ),
        (
            [tool("f", obj(s={"enum": list(range(10_001))}))],
            "tools[0].function.parameters",
            "schema_nodes",
        ),
        (
            [tool(f"f{j}", obj(c={"enum": looks(400)})) for j in range(3)],
            "tools[2].function.parameters with the tools before it",
            "enum_values",
        ),
        (
            [tool(f"f{j}", obj(s={"type": "string", "maxLength": 1000})) for j in range(51)],
            "tools[50].function.parameters with the tools before it",
            "schema_repeats",
        ),
        ([tool(f"f{j}", {"type": "object"}) for j in range(TOOLS.value + 1)], "tools", "tools"),
    ],
    ids=[
        "enum",
        "chars",
        "alternatives",
        "depth",
        "optional",
        "pattern",
        "repeats",
        "bytes",
        "nodes",
        "enums together",
        "repeats together",
        "count",
    ],
)
def test_tools_over_a_limit_are_a_400_naming_it(tools, field, key):
    with pytest.raises(InvalidRequest) as info:
        tools_field(tools)
    message = str(info.value)
    assert message.startswith("invalid tools: "), message
    assert f"{field} " in message and f"({key})" in message, message


def test_tools_within_the_limits_pass():
    tools = [tool(f"f{j}", obj(c={"enum": looks(150)})) for j in range(5)]
    assert tools_field(tools) == tools
    check_tools([tool(f"f{j}", {"type": "object"}) for j in range(TOOLS.value)])
    check_tools([tool("f", obj(c={"enum": looks(20)}))], SchemaLimits(max_enum_values=20))


def test_the_runners_tool_grammar_leaves_huge_counts_open():
    # the server's check passes this (the count is loosened, not refused);
    # the runner builds the grammar from the schema as sent
    fmt = detect_format(read_template("Qwen-QwQ-32B"))
    params = obj(s={"type": "string", "maxLength": 2**31 - 1, "pattern": "^a{5,2147483647}$"})
    check_tools([tool("f", params)])
    built = tool_grammar(fmt, [tool("f", params)], "required")
    assert built is not None and not re.search(r"\d{5,}", built.grammar), built.grammar


def test_the_runners_tool_grammar_is_one_budget():
    fmt = detect_format(read_template("Qwen-QwQ-32B"))
    each = obj(u={"anyOf": [{"type": "string", "minLength": i} for i in range(100)]})
    tool_grammar(fmt, [tool("f", each), tool("g", each)], "required")
    with pytest.raises(GrammarTooLarge, match="schema_alternatives"):
        tool_grammar(fmt, [tool(f"f{j}", each) for j in range(3)], "required")


def test_a_schema_sent_again_is_built_once_and_refusals_are_not_kept():
    schema = {"type": "object", "properties": {"c": {"enum": looks(50)}}}
    first = parse_format(schema)
    again = parse_format(json.loads(json.dumps(schema)))
    assert again is first  # the same JSON: the format built the first time
    assert parse_format({**schema, "required": ["c"]}) is not first
    too_wide = {"enum": looks(ENUM_VALUES.value + 1)}
    for _ in range(2):
        with pytest.raises(InvalidRequest, match="enum_values"):
            parse_format(too_wide)
    assert check_output(first, json.dumps({"c": looks(50)[7]})) is None
    assert "does not match" in check_output(first, '{"c": "value-999999-xxxxx"}')


def test_limits_come_from_the_table():
    assert LIMITS.max_enum_values == ENUM_VALUES.value
    assert LIMITS.max_enum_chars == ENUM_CHARS.value
    assert LIMITS.max_alternatives == SCHEMA_ALTERNATIVES.value
