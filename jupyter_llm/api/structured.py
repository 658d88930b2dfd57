"""``format``: structured outputs as llama.cpp grammars (BEHAVIOUR.md, API).

Missing, null and "" mean no constraint; "json" is any JSON object; an object
is a JSON Schema, checked against its meta-schema and converted to a grammar
before anything is scheduled. A schema keyword the converter cannot express is
refused by name, never silently dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jupyter_llm.errors import InvalidRequest

# keywords llama-cpp-python's converter turns into grammar, and annotations
# that constrain nothing
SUPPORTED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "pattern",
    "format",
    "minLength",
    "maxLength",
}
ANNOTATIONS = {
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
    "deprecated",
}
FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


@dataclass(frozen=True)
class OutputFormat:
    """A grammar for the sampler and, for a schema, the schema to check against."""

    grammar: str
    schema: dict[str, Any] | None = None  # None: any JSON object


def invalid_format(value: object) -> InvalidRequest:
    return InvalidRequest(
        f'invalid format: {json.dumps(value)}; expected "json" or a valid JSON Schema object'
    )


def parse_format(value: object) -> OutputFormat | None:
    """The constraint a request's ``format`` asks for, or None."""
    if value is None or value == "":
        return None
    if value == "json":
        return OutputFormat(grammar=_to_grammar({"type": "object"}))
    if not isinstance(value, dict):
        raise invalid_format(value)
    import jsonschema

    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError:
        raise invalid_format(value) from None
    unsupported = find_unsupported(value)
    if unsupported:
        keyword, where = unsupported
        raise InvalidRequest(
            f"invalid format: the JSON Schema keyword {keyword!r} at {where} cannot be "
            "enforced by the grammar; remove it or express it another way"
        )
    return OutputFormat(grammar=_to_grammar(value), schema=value)


def find_unsupported(schema: Any, where: str = "$") -> tuple[str, str] | None:
    """The first keyword (or format) the converter would drop, with its path."""
    if isinstance(schema, bool) or not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if key not in SUPPORTED and key not in ANNOTATIONS:
            return key, where
        if key == "format" and value not in FORMATS:
            return f"format: {value}", where
        if key in SUBSCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                if hit := find_unsupported(sub, f"{where}.{key}.{name}"):
                    return hit
        elif key in SUBSCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                if hit := find_unsupported(sub, f"{where}.{key}[{i}]"):
                    return hit
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            if hit := find_unsupported(value, f"{where}.{key}"):
                return hit
    return None


def _to_grammar(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    order = list(schema.get("properties", {})) if isinstance(schema.get("properties"), dict) else []
    try:
        return json_schema_to_gbnf(json.dumps(schema), prop_order=order)
    except Exception as e:  # the converter asserts on shapes it does not know
        raise InvalidRequest(
            f"invalid format: the schema cannot be turned into a grammar: {e}"
        ) from None


def check_output(fmt: OutputFormat, text: str) -> str | None:
    """None if ``text`` parses (and validates); else what is wrong."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"output is not JSON: {e}"
    if fmt.schema is None:
        return None if isinstance(value, dict) else "output is not a JSON object"
    import jsonschema

    try:
        jsonschema.validate(value, fmt.schema)
    except jsonschema.ValidationError as e:
        return f"output does not match the schema: {e.message}"
    return None
