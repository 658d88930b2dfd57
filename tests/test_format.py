"""``format`` handling: the cases BEHAVIOUR.md names, including Ollama's regression pair."""

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.api.structured import find_unsupported, parse_format
from jupyter_llm.errors import InvalidRequest

EXPECTED = '; expected "json" or a valid JSON Schema object'


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
    ],
)
def test_invalid_format_message(value, shown):
    with pytest.raises(InvalidRequest) as info:
        parse_format(value)
    assert str(info.value) == f"invalid format: {shown}{EXPECTED}"


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "integer", "minimum": 0}, "minimum"),
        ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "not"),
        ({"type": "string", "format": "email"}, "format: email"),
        ({"type": "array", "items": {"type": "number", "multipleOf": 2}}, "multipleOf"),
        ({"type": "object", "patternProperties": {"x": {}}}, "patternProperties"),
    ],
)
def test_unsupported_keyword_is_named(schema, keyword):
    assert find_unsupported(schema)[0] == keyword
    with pytest.raises(InvalidRequest, match=f"keyword '{keyword}'"):
        parse_format(schema)


def test_supported_schema_with_annotations_and_refs():
    schema = {
        "title": "Person",
        "type": "object",
        "$defs": {"Tag": {"type": "string"}},
        "properties": {
            "name": {"type": "string", "description": "x"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
            "when": {"type": "string", "format": "date"},
            "kind": {"enum": ["a", "b"]},
        },
        "required": ["name"],
    }
    assert parse_format(schema).schema == schema


async def post(jp_fetch, body):
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
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
