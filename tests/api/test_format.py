"""``format``: the cases BEHAVIOUR.md names (Ollama's regression pair
included), and the grammars, checked by llama.cpp's own grammar engine."""

from __future__ import annotations

import json
import logging
import time
from decimal import Decimal

import pytest
from grammar_probe import GrammarProbe
from hypothesis import given, settings
from hypothesis import strategies as st
from tornado.httpclient import HTTPClientError

from jupyter_llm.api import output_check
from jupyter_llm.api.structured import parse_format
from jupyter_llm.grammar.gbnf import seq
from jupyter_llm.grammar.numbers import Bound, integer_range, number_range
from jupyter_llm.request.errors import InvalidRequest

EXPECTED = '; expected "json" or a valid JSON Schema object'


@pytest.fixture(scope="module")
def probe(demo_gguf):
    probe = GrammarProbe(demo_gguf)
    yield probe
    probe.close()


def grammar(fmt) -> str:
    return parse_format(fmt).grammar


@pytest.mark.parametrize("value", [None, ""])
def test_no_constraint(value):
    assert parse_format(value) is None


def test_json_is_any_object():
    fmt = parse_format("json")
    assert fmt.schema is None and "root" in fmt.grammar


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("yaml", '"yaml"'),
        (7, "7"),
        ([1], "[1]"),
        (True, "true"),
        ({"type": "nonsense"}, '{"type": "nonsense"}'),
        ({"properties": 5}, '{"properties": 5}'),
        ({"type": "integer", "minimum": "0"}, '{"type": "integer", "minimum": "0"}'),
    ],
)
def test_invalid_format_message(value, shown):
    with pytest.raises(InvalidRequest) as info:
        parse_format(value)
    assert str(info.value) == f"invalid format: {shown}{EXPECTED}"


DRAFT_4 = {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 9}


def test_a_draft_4_schema_without_its_uri_is_accepted_and_checked_as_draft_4(probe):
    from jupyter_llm.grammar.check import check_output

    fmt = parse_format(DRAFT_4)
    assert not probe.accepts(fmt.grammar, "0") and probe.accepts(fmt.grammar, "1")
    assert check_output(fmt, "1") is None
    assert "does not match" in check_output(fmt, "0")


# -- what the grammar cannot enforce is accepted, ignored and logged ---------------------------
@pytest.mark.parametrize(
    ("schema", "logged"),
    [
        (
            {"type": "object", "properties": {"a": {"not": {"type": "null"}}}},
            "'not' at $.properties.a",
        ),
        (
            {"type": "array", "items": {"type": "number", "multipleOf": 2}},
            "'multipleOf' at $.items",
        ),
        ({"type": "object", "patternProperties": {"x": {}}}, "'patternProperties' at $"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems' at $"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired' at $"),
        ({"type": "string", "format": "idn-email"}, "format 'idn-email' at $"),
        ({"type": "string", "pattern": "^(?=a)a$"}, "pattern '^(?=a)a$' at $"),
        ({"type": "string", "pattern": r"^(a)\1$"}, r"pattern '^(a)\\1$' at $"),
        ({"type": "string", "pattern": "^a$", "maxLength": 3}, "minLength/maxLength at $"),
        ({"$ref": "https://example.com/s.json"}, "$ref 'https://example.com/s.json' at $"),
        ({"if": {"type": "string"}, "then": {"minLength": 1}}, "'if' at $"),
        ({"type": "integer", "minimum": 10**4000}, "minimum/maximum at $ is beyond 40 digits"),
        ({"type": "number", "exclusiveMinimum": 1e-300}, "minimum/maximum at $ is beyond 40"),
        ({"anyOf": [{"$ref": "#"}, {"type": "string"}]}, "$ref '#' at #.anyOf[0] is a cycle"),
        (
            {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            },
            "$ref '#/$defs/a' at #/$defs/b is a cycle",
        ),
        (
            {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
            "$ref '#/$defs/a' at #/$defs/a.allOf[0] is already merged here",
        ),
    ],
)
def test_what_the_grammar_cannot_enforce_is_ignored_and_logged(probe, caplog, schema, logged):
    with caplog.at_level(logging.DEBUG, logger="jupyter_llm.grammar.json_schema"):
        fmt = parse_format(schema)
    assert fmt.schema == schema
    assert probe.parses(fmt.grammar)
    assert any(logged in r.getMessage() for r in caplog.records), caplog.text


def test_enforced_keywords_log_nothing(caplog):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
    }
    with caplog.at_level(logging.DEBUG, logger="jupyter_llm.grammar.json_schema"):
        parse_format(schema)
    assert caplog.records == []


# -- grammars: what llama.cpp's grammar engine accepts ------------------------------------------
OBJECT = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    "required": ["b"],
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer", "minimum": 0, "maximum": 9},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
            },
            "required": ["v"],
        }
    },
    "$ref": "#/$defs/node",
}
ALL_OF = {
    "allOf": [
        {"$ref": "#/$defs/a"},
        {"properties": {"y": {"type": "integer"}}, "required": ["y"]},
    ],
    "$defs": {"a": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
}
CASES = [
    # (format, accepted, refused)
    (
        "json",
        ['{}', '{"a": 1}', '{"a":"x\\n\\t\\"\\\\\\/\\u00e9"}', '{"a": [1, -2.5e3, null, true]}'],
        ['{"a":"\x01"}', '{"a":"\n"}', '{"a":"\x1f"}', '{"a":"\\x41"}', '{"a":"\\a"}',
         '{"a":"\\u00g1"}', "[1]", '"s"', '{"a": 01}', '{"a": 1.}', '{"a": .5}'],
    ),
    ({"type": "integer", "minimum": 0}, ["0", "7", "123"], ["-1", "-0", "01", "1.5"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, ["1", "9"], ["0", "10"]),
    (
        {"type": "integer", "minimum": 0, "exclusiveMinimum": True,
         "maximum": 10, "exclusiveMaximum": True, "$schema": "http://json-schema.org/draft-04/schema#"},
        ["1", "9"],
        ["0", "10"],
    ),
    ({"type": "integer", "minimum": -17, "maximum": 1234}, ["-17", "-1", "0", "1234", "999"],
     ["-18", "1235", "2000", "-0"]),
    ({"type": "integer", "minimum": 2.5, "maximum": 7.5}, ["3", "7"], ["2", "8"]),
    ({"type": "number", "minimum": -2.5, "exclusiveMaximum": 3.75},
     ["-2.5", "-2.50", "-0.1", "0", "0.0", "3", "3.7499", "1.25"],
     ["-2.51", "-3", "3.75", "3.750", "4", "1e2"]),
    ({"type": "number", "exclusiveMinimum": 0}, ["0.001", "5", "12.5"], ["0", "0.0", "-1"]),
    ({"type": "number", "minimum": 0.25, "maximum": 0.75}, ["0.25", "0.5", "0.75"],
     ["0.2", "0.751", "1", "0"]),
    ({"type": "number"}, ["1", "-0.5", "2.5e-3", "1E+10"], ["+1", "1e", "--1"]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"a\\nb"', '"éé"'],
     ['"a"', '"abcd"', '"a\nb"']),
    ({"type": "string", "pattern": r"^[a-z]{2,4}-\d+$"}, ['"ab-12"', '"abcd-0"'],
     ['"a-1"', '"ABC-1"', '"ab-"', '"ab-1x"']),
    ({"type": "string", "pattern": '^a"b\\\\$'}, ['"a\\"b\\\\"'], ['"a"b\\\\"', '"ab"']),
    ({"type": "string", "pattern": "abc"}, ['"abc"', '"xxabcyy"'], ['"ab"']),
    ({"type": "string", "pattern": r"^\s$"}, ['" "', '"\\n"', '"\\t"'], ['"\n"', '"a"']),
    ({"type": "string", "pattern": "^(ab|cd)+?x?$"}, ['"ab"', '"abcdx"'], ['"x"', '"ac"']),
    ({"type": "string", "pattern": "^a]}$"}, ['"a]}"'], ['"a"']),
    ({"type": "string", "pattern": "^[^a-z]$"}, ['"A"', '"\\""', '"\\u0001"'],
     ['"a"', '"\x01"']),
    ({"type": "string", "format": "date"}, ['"2024-02-29"'], ['"2024-13-01"', '"24-01-01"']),
    ({"type": "string", "format": "time"}, ['"23:59:59Z"', '"01:02:03.5+02:00"'], ['"24:00:00Z"']),
    ({"type": "string", "format": "date-time"}, ['"2024-01-02T03:04:05Z"'], ['"2024-01-02"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'],
     ['"123e4567"']),
    ({"type": "string", "format": "email"}, ['"ann.lee@example.org"'], ['"ann"']),
    ({"type": "string", "format": "ipv4"}, ['"192.168.0.255"'], ['"256.1.1.1"']),
    ({"type": "string", "format": "hostname"}, ['"a-1.example.org"'], ['"a-.org"', '"org"']),
    ({"type": "string", "format": "uri"}, ['"https://example.org:8080/a/b?q=1"', '"http://x.io"'],
     ['"example.org"', '"https://"']),
    ({"enum": ["a", 1, None, {"k": [1]}]}, ['"a"', "1", "null", '{"k":[1]}'], ['"b"', "2"]),
    ({"const": "x\ny"}, ['"x\\ny"'], ['"x\ny"', '"x"']),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
     ["[1]", "[1, 2]"], ["[]", "[1,2,3]"]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     ['["a", 1]'], ['["a"]', '[1, 1]', '["a", 1, 2]']),
    (OBJECT, ['{"b": "x"}', '{"a": 1, "b": "x", "c": true}', '{"b":"x","c":false}'],
     ["{}", '{"a": 1}', '{"b": "x", "a": 1}', '{"b": "x", "d": 1}']),
    ({**OBJECT, "additionalProperties": {"type": "integer"}},
     ['{"b": "x", "d": 1}', '{"b": "x", "bb": 2, "": 3, "a1": 4}'],
     ['{"b": "x", "d": "y"}', '{"b": "x", "b": 2}', '{"b": "x", "c": 2}']),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "required": ["n"]},
     ['{"n": 1}', '{"n": 1, "m": 2}'], ["{}", '{"m": 2}']),
    (TREE, ['{"v": 1}', '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}'],
     ['{"v": 10}', '{"kids": []}', '{"v": 1, "kids": [{"v": 2}, {"v": 3}, {"v": 4}]}']),
    ({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "null"}]}, ['"a"', "null"],
     ['"ab"', "1"]),
    (ALL_OF, ['{"x": 1, "y": 2}'], ['{"x": 1}', '{"y": 2}']),
    ({"type": ["integer", "null"]}, ["1", "null"], ['"1"']),
    ({"type": "object", "properties": {"a": False, "b": {"type": "integer"}}}, ['{"b": 1}'],
     ['{"a": 1}']),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "accepted", "refused"), CASES, ids=lambda v: json.dumps(v)[:60])
def test_grammar_accepts_and_refuses(probe, fmt, accepted, refused):
    g = grammar(fmt)
    assert probe.parses(g), g
    for text in accepted:
        assert probe.accepts(g, text), (text, g)
        if isinstance(fmt, dict):  # the cases themselves are right
            import jsonschema

            jsonschema.validate(json.loads(text), fmt)
    for text in refused:
        assert not probe.accepts(g, text), (text, g)


# the integer and number ranges against Python's own comparison
DIGITS = st.integers(-(10**6), 10**6)


@settings(max_examples=150, deadline=None)
@given(low=st.none() | DIGITS, high=st.none() | DIGITS, x=DIGITS)
def test_integer_ranges_are_exact(probe, low, high, x):
    if low is not None and high is not None and low > high:
        low, high = high, low
    g = f"root ::= {integer_range(low, high)}\n"
    inside = (low is None or low <= x) and (high is None or x <= high)
    assert probe.accepts(g, str(x)) == inside, (low, high, x, g)


def decimals():
    return st.builds(
        lambda sign, whole, frac: Decimal(f"{sign}{whole}{'.' + frac if frac else ''}"),
        st.sampled_from(["", "-"]),
        st.integers(0, 120),
        st.text("0123456789", max_size=3),
    )


@settings(max_examples=200, deadline=None)
@given(
    low=st.none() | decimals(),
    high=st.none() | decimals(),
    low_strict=st.booleans(),
    high_strict=st.booleans(),
    x=decimals(),
)
def test_number_ranges_are_exact(probe, low, high, low_strict, high_strict, x):
    if low is not None and high is not None and low > high:
        low, high = high, low
    lo = None if low is None else Bound(low, low_strict)
    hi = None if high is None else Bound(high, high_strict)
    expr = number_range(lo, hi)
    text = str(x)
    if text.startswith("-") and x == 0:
        text = text[1:]  # "-0.0" is 0, but the grammar writes zero unsigned
    inside = (lo is None or x > lo.value or (x == lo.value and not lo.strict)) and (
        hi is None or x < hi.value or (x == hi.value and not hi.strict)
    )
    if expr is None:
        assert not inside
        return
    g = f"root ::= {seq(expr)}\n"
    assert probe.accepts(g, text) == inside, (lo, hi, text, g)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**15), 10**15)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3), ascii_only=st.booleans()
)
def test_json_grammar_takes_what_json_dumps_writes(probe, value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert probe.accepts(grammar("json"), text), text


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=1, max_size=6), control=st.characters(max_codepoint=0x1F))
def test_json_grammar_refuses_raw_control_characters(probe, text, control):
    raw = '{"k": "' + json.dumps(text)[1:-1] + control + '"}'
    assert not probe.accepts(grammar("json"), raw)


# patterns against Python's re, both ways: what re finds the grammar writes
# (printable ASCII), and what the grammar writes re finds
PATTERNS = [
    r"^[a-z]{2,4}-\d+$",
    r"^(ab|c)*d?$",
    r"^[^abc]{1,3}$",
    r"^a.b$",
    r"x[yz]",
    r"^\w+@\w+\.(com|org)$",
    r'^["\\]{2}$',
    r"^(?:0|[1-9][0-9]*)(\.[0-9]+)?$",
    r"^\S\s\S$",
    r"^[\x41-\x43\-]+$",
    r"^a{2}b{1,}c{0,2}$",
]
ALPHABET = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


@pytest.mark.parametrize("regex", PATTERNS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_patterns_agree_with_re(probe, regex, data):
    import re

    g = grammar({"type": "string", "pattern": regex})
    # (re's "$" also matches before a final newline; the grammar ends there)
    found = data.draw(st.from_regex(regex, alphabet=ALPHABET).filter(lambda t: t[-1:] != "\n"))
    assert probe.accepts(g, json.dumps(found)), (regex, found)
    text = data.draw(st.text(st.sampled_from(sorted(set(regex + 'ab1 _-"\\\n'))), max_size=6))
    if probe.accepts(g, json.dumps(text)):
        assert re.search(regex, text), (regex, text)


# any schema: parse_format answers a grammar llama.cpp parses, or a 400
NUMBERS = st.integers(-1000, 1000) | st.floats(-1e6, 1e6, allow_nan=False) | st.booleans()
LEAVES = st.one_of(
    st.sampled_from([True, False, {}, {"type": "null"}, {"type": "boolean"}]),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["integer", "number", ["integer", "null"]])},
        optional={
            k: NUMBERS
            for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={
            "minLength": st.integers(0, 5),
            "maxLength": st.integers(0, 5),
            "pattern": st.sampled_from(
                [
                    "^a+$",
                    "x",
                    "^[^a]*$",
                    "(a|)",
                    "^\\d{2,}$",
                    "^(?!a)",
                    "[",
                    "a{3}}",
                    "^$",
                    "|",
                    "^.$",
                ]
            ),
            "format": st.sampled_from(["date", "uuid", "email", "nonsense", "uri", "time"]),
        },
    ),
    st.builds(lambda v: {"enum": v}, st.lists(JSON_VALUES, min_size=1, max_size=3)),
    st.builds(lambda v: {"const": v}, JSON_VALUES),
    st.sampled_from([{"$ref": r} for r in ("#", "#/$defs/a", "#/$defs/b", "#/nope", "x.json")]),
)


def _extend(inner):
    texts = st.text("abc", max_size=2)
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object")},
            optional={
                "properties": st.dictionaries(texts, inner, max_size=3),
                "required": st.lists(texts, max_size=2, unique=True),
                "additionalProperties": inner,
                "minProperties": st.integers(0, 2),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("array")},
            optional={
                "items": inner,
                "prefixItems": st.lists(inner, max_size=2),
                "minItems": st.integers(0, 3),
                "maxItems": st.integers(0, 3),
                "uniqueItems": st.booleans(),
                "contains": inner,
            },
        ),
        st.fixed_dictionaries(
            {},
            optional={
                k: st.lists(inner, min_size=1, max_size=3) for k in ("anyOf", "oneOf", "allOf")
            }
            | {"not": inner, "$ref": st.sampled_from(["#", "#/$defs/a", "#/$defs/b"])},
        ),
    )


SCHEMAS = st.recursive(LEAVES, _extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(root=SCHEMAS, a=SCHEMAS, b=SCHEMAS)
def test_any_valid_schema_gets_a_grammar_llama_cpp_parses(probe, root, a, b):
    import jsonschema

    schema = {**root, "$defs": {"a": a, "b": b}} if isinstance(root, dict) else root
    if isinstance(schema, bool):
        schema = {"allOf": [schema], "$defs": {"a": a, "b": b}}
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return
    try:
        fmt = parse_format(schema)
    except InvalidRequest as e:
        assert "invalid format: " in str(e)
        return
    assert probe.parses(fmt.grammar), (schema, fmt.grammar)


# -- pydantic ------------------------------------------------------------------------------
def pydantic_models():
    import datetime
    import enum
    import uuid
    from typing import Literal

    from pydantic import BaseModel, Field

    class Colour(enum.StrEnum):
        red = "red"
        green = "green"

    class Address(BaseModel):
        street: str = Field(min_length=1, max_length=40)
        postcode: str = Field(pattern=r"^[0-9]{5}$")
        country: Literal["DE", "FR", "NL"] = "DE"

    class Person(BaseModel):
        name: str
        age: int = Field(ge=0, le=150)
        height: float = Field(gt=0, lt=3.5)
        score: float | None = Field(default=None, ge=-1, le=1)
        born: datetime.date
        seen: datetime.datetime
        id: uuid.UUID
        colour: Colour
        tags: list[str] = Field(default_factory=list, max_length=5)
        address: Address
        others: list[Address] = []
        manager: Person | None = None

    return Person, Address, Colour


def test_a_pydantic_model_with_bounds_is_accepted_and_its_json_fits(probe):
    pytest.importorskip("pydantic")
    import datetime
    import uuid

    Person, Address, Colour = pydantic_models()
    schema = Person.model_json_schema()
    fmt = parse_format(schema)
    assert probe.parses(fmt.grammar)
    home = Address(street="Main St 1", postcode="12345", country="NL")
    person = Person(
        name='Ann "A" Lee',
        age=41,
        height=1.7,
        score=-0.25,
        born=datetime.date(1984, 2, 29),
        seen=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        id=uuid.UUID("123e4567-e89b-12d3-a456-426614174000"),
        colour=Colour.green,
        tags=["a", "b"],
        address=home,
        others=[home],
        manager=Person(
            name="Bo",
            age=0,
            height=0.5,
            born=datetime.date(2000, 1, 1),
            seen=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
            id=uuid.uuid4(),
            colour=Colour.red,
            address=home,
        ),
    )
    assert probe.accepts(fmt.grammar, person.model_dump_json())
    too_old = person.model_dump_json().replace('"age":41', '"age":151')
    assert not probe.accepts(fmt.grammar, too_old)


def test_grammar_build_time_for_a_large_pydantic_schema(capsys):
    """Not a timed assertion: prints the figure for the record."""
    pytest.importorskip("pydantic")
    from pydantic import create_model

    Person, _, _ = pydantic_models()
    fields = {f"p{i}": (Person, ...) for i in range(40)}
    fields |= {f"q{i}": (int | None, None) for i in range(60)}
    Big = create_model("Big", **fields)
    schema = Big.model_json_schema()
    started = time.perf_counter()
    fmt = parse_format(schema)
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"\n[grammar build] {len(json.dumps(schema))} bytes of schema -> "
            f"{len(fmt.grammar)} bytes of grammar in {elapsed * 1000:.1f} ms"
        )


# -- through the server ------------------------------------------------------------------
async def post(jp_fetch, body, *path):
    r = await jp_fetch("llm", *(path or ("api", "generate")), method="POST", body=json.dumps(body))
    return json.loads(r.body)


BASE = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}


@pytest.mark.parametrize("fmt", [None, ""])
async def test_empty_format_accepted(jp_fetch, installed_model, fmt):
    # the regression pair: empty is accepted ...
    assert (await post(jp_fetch, {**BASE, "format": fmt}))["done"] is True


async def test_invalid_format_refused_before_any_load(jp_fetch, installed_model):
    # ... while invalid stays rejected, and costs no model load
    for fmt in ("yaml", {"type": "nonsense"}, 3):
        with pytest.raises(HTTPClientError) as info:
            await post(jp_fetch, {**BASE, "format": fmt})
        assert info.value.code == 400
        assert json.loads(info.value.response.body)["error"].startswith("invalid format: ")
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    assert ps == []


async def test_format_json_streams_an_object(jp_fetch, installed_model):
    r = await post(jp_fetch, {**BASE, "format": "json", "options": {"num_predict": 300, "seed": 4}})
    if r["done_reason"] == "stop":
        assert isinstance(json.loads(r["response"]), dict)
    else:
        assert r["response"].lstrip().startswith("{")


MINIMUM = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
}


async def test_a_schema_with_minimum_through_every_route(jp_fetch, installed_model):
    import jsonschema

    options = {"num_predict": 40, "seed": 1}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "n?"}], "stream": False}
    r = await post(jp_fetch, {**chat, "format": MINIMUM, "options": options}, "api", "chat")
    jsonschema.validate(json.loads(r["message"]["content"]), MINIMUM)
    r = await post(jp_fetch, {**BASE, "format": MINIMUM, "options": options})
    jsonschema.validate(json.loads(r["response"]), MINIMUM)
    body = {
        **chat,
        "max_tokens": 40,
        "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": MINIMUM}},
    }
    r = await post(jp_fetch, body, "v1", "chat", "completions")
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), MINIMUM)


async def test_output_the_grammar_cannot_hold_to_the_schema_is_logged(
    jp_fetch, installed_model, caplog
):
    # multipleOf is ignored by the grammar; a value that misses it is logged
    # (on /v1, and when streaming too): no value from 1 to 9 is a multiple of 10
    schema = {"type": "integer", "minimum": 1, "maximum": 9, "multipleOf": 10}
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "n?"}],
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    with caplog.at_level(logging.WARNING, logger="jupyter_llm.api.output_check"):
        r = await post(jp_fetch, {**body, "seed": 3}, "v1", "chat", "completions")
        await jp_fetch(
            "llm", "v1", "chat", "completions", method="POST",
            body=json.dumps({**body, "seed": 4, "stream": True}),
        )  # fmt: skip
        await output_check.checks_done()  # checked after the answer, in a helper process
    assert 1 <= int(r["choices"][0]["message"]["content"]) <= 9
    failed = [r for r in caplog.records if "structured output check failed" in r.getMessage()]
    assert len(failed) == 2, caplog.text


# repeats nested in repeats: a budget adding counts passes them, llama.cpp
# multiplies them (past 2,000 rules it refuses the grammar)
NESTED_REPEATS = [
    ("^([a-z]{1,20} ){1,100}$", False),
    ("^(.{1,100}\n){0,50}$", False),
    ("^(ab?){666}$", True),  # the grammar's groups and the ? rule: 3 rules x 666
    ("^(ab?){667}$", False),  # 2,001
    ("^([a-z]*){666}$", True),
    ("^([a-z]*){667}$", False),
    ("^[a-z]{1,20}$", True),
    ("^([a-z]{1,20}){1,1000}$", False),
]


@pytest.mark.parametrize(("pattern", "parses"), NESTED_REPEATS)
def test_a_grammar_llama_cpp_would_refuse_is_known_before_any_load(probe, pattern, parses):
    """The rule count read as llama.cpp's parser reads it agrees with the
    parser itself, and a format it would refuse is the request's 400 at
    once, not a failed request once the runner loaded the model."""
    from jupyter_llm.grammar.check import OutputFormat
    from jupyter_llm.grammar.gbnf import GrammarBudget
    from jupyter_llm.grammar.json_schema import schema_to_grammar
    from jupyter_llm.grammar.llama_rules import repetition_refusal

    schema = {"type": "string", "pattern": pattern}
    text = schema_to_grammar(schema, GrammarBudget())
    assert probe.parses(text) is parses
    assert (repetition_refusal(text) is None) is parses
    if parses:
        assert isinstance(parse_format(schema), OutputFormat)
    else:
        with pytest.raises(InvalidRequest, match=r"nests repeats past llama\.cpp"):
            parse_format(schema)


async def test_a_nested_repeat_is_refused_before_any_load(jp_fetch, installed_model):
    fmt = {"type": "string", "pattern": "^([a-z]{1,20} ){1,100}$"}
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, {**BASE, "format": fmt})
    assert info.value.code == 400
    assert "llama.cpp" in json.loads(info.value.response.body)["error"]
    assert json.loads((await jp_fetch("llm", "api", "ps")).body)["models"] == []
