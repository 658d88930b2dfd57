"""The RFC 8259 property, with real runners: hundreds of outputs of a
random-weight model under ``format: "json"`` and under schemas with bounds,
patterns, formats, enums and nested ``$ref``s. Every output that ends by itself
parses with ``json.loads`` and validates against its schema; no output, ended
or cut off by ``num_predict``, holds a control character (the grammars'
only whitespace is a space)."""

from __future__ import annotations

import json
import time

import jsonschema
from fuzz_depth import examples

SCHEMAS: dict[str, object] = {
    "json": "json",
    "bounds": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": -50, "exclusiveMaximum": 50},
            "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5},
            "y": {"type": "number", "minimum": -1.25, "maximum": -0.5},
        },
        "required": ["n", "x", "y"],
    },
    "patterns": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "tag": {"type": "string", "pattern": '^(x|y"|\\\\z){1,3}$'},
            "note": {"type": "string", "minLength": 1, "maxLength": 6},
        },
        "required": ["code", "tag", "note"],
    },
    "formats": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["day", "at", "id"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "c": {"enum": ["red", "green", 3, None, {"k": [1, 2]}]},
            "v": {"const": "v1"},
            "flag": {"type": "boolean"},
        },
        "required": ["c", "v"],
    },
    "refs": {
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "label": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
                },
                "required": ["x", "label"],
            },
            "Node": {
                "type": "object",
                "properties": {
                    "at": {"$ref": "#/$defs/Point"},
                    "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
                },
                "required": ["at", "next"],
            },
        },
        "type": "object",
        "properties": {
            "head": {"$ref": "#/$defs/Node"},
            "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "maxItems": 2},
        },
        "required": ["head", "points"],
    },
}
SEEDS = range(examples(20, 40))  # per schema (CONTRIBUTING.md: the deep run)
TEMPERATURES = (0.4, 0.8, 1.0, 1.5)
NUM_PREDICT = 160


async def test_every_output_is_json_and_matches_its_schema(jp_fetch, installed_model, capsys):
    started = time.perf_counter()
    parsed, cut = {name: 0 for name in SCHEMAS}, {name: 0 for name in SCHEMAS}
    for name, fmt in SCHEMAS.items():
        for seed in SEEDS:
            body = {
                "model": "tiny",
                "prompt": f"{name} {seed}",
                "stream": False,
                "format": fmt,
                "options": {
                    "seed": seed,
                    "temperature": TEMPERATURES[seed % len(TEMPERATURES)],
                    "num_predict": NUM_PREDICT,
                },
            }
            r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
            answer = json.loads(r.body)
            text = answer["response"]
            assert not any(ord(ch) < 0x20 for ch in text), (name, seed, text)
            if answer["done_reason"] != "stop":
                cut[name] += 1
                continue
            value = json.loads(text)  # RFC 8259: json.loads is strict about controls
            if fmt == "json":
                assert isinstance(value, dict), text
            else:
                jsonschema.validate(value, fmt, format_checker=jsonschema.FormatChecker())
            parsed[name] += 1
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(f"\n[format property] parsed {parsed}, cut off {cut}, in {elapsed:.1f} s")
    assert sum(parsed.values()) >= len(SEEDS) * len(SCHEMAS) * 5 // 6, (parsed, cut)
    # each format is exercised: the schemas bound every output's length (so
    # nearly all end by themselves), "json" does not
    for name in SCHEMAS:
        assert parsed[name] >= len(SEEDS) // (4 if name == "json" else 4 / 3), (name, parsed, cut)
