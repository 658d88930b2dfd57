"""``format``: structured outputs as llama.cpp grammars (BEHAVIOUR.md, API).

Missing, null and "" mean no constraint; "json" is any JSON object; an object
is a JSON Schema, checked against its meta-schema and converted to a grammar
(``json_grammar``) before anything is scheduled. Every valid schema is
accepted: what the grammar cannot enforce is ignored, as Ollama does, and
logged at DEBUG; the output is checked against the schema afterwards
(``check_output``).

What a schema may make the converter build is bounded (``SchemaLimits``, the
one place for those bounds): its size, nesting, optional properties and the
repeats it spells out; a schema beyond them is refused. A count above
``max_repeat`` (``maxLength``, ``maxItems``, ``{m,n}`` in a ``pattern``...) is
not spelled out: "at most 2^31" is treated as unbounded, "at least 2^31" as
"at least max_repeat".
The grammar is then looser than the schema; the output is still checked
against the schema as sent. Parsing a format is CPU work: handlers run it
off the event loop.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jupyter_llm.errors import InvalidRequest
from jupyter_llm.json_grammar import json_object_grammar, schema_to_grammar

SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


@dataclass(frozen=True)
class SchemaLimits:
    """What one ``format`` may ask of the grammar converter."""

    max_bytes: int = 256 << 10  # the schema as JSON
    max_nodes: int = 10_000  # values in it: objects, lists and scalars
    max_depth: int = 64  # their nesting
    max_repeat: int = 1000  # a count above this is not spelled out in the grammar
    repeat_budget: int = 50_000  # counts spelled out, all together
    # optional properties per object, and their square summed over objects
    # (the bound of llama-cpp-python's converter, whose rules grew with that
    # square; ours grow linearly, the refusal is kept)
    max_optional: int = 256
    optional_budget: int = 4 * 256 * 256
    max_pattern: int = 4096  # characters in one ``pattern``


LIMITS = SchemaLimits()
COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


@dataclass(frozen=True)
class OutputFormat:
    """A grammar for the sampler and, for a schema, the schema to check against."""

    grammar: str
    schema: dict[str, Any] | None = None  # None: any JSON object
    validator: Any = None  # the jsonschema validator class the schema is valid for


def invalid_format(value: object) -> InvalidRequest:
    return InvalidRequest(
        f'invalid format: {json.dumps(value)}; expected "json" or a valid JSON Schema object'
    )


def parse_format(value: object) -> OutputFormat | None:
    """The constraint a request's ``format`` asks for, or None."""
    if value is None or value == "":
        return None
    if value == "json":
        return OutputFormat(grammar=json_object_grammar())
    if not isinstance(value, dict):
        raise invalid_format(value)
    check_size(value)
    validator = schema_dialect(value)
    bounded = bounded_schema(value)
    try:
        grammar = schema_to_grammar(bounded)
    except RecursionError:  # e.g. an allOf that includes itself
        raise _too_large("the schema's allOf/anyOf nest without end") from None
    return OutputFormat(grammar=grammar, schema=value, validator=validator)


def schema_dialect(schema: dict[str, Any]) -> Any:
    """The jsonschema validator class ``schema`` is valid for: its ``$schema``'s,
    or without one the newest draft it is valid in (a draft-4 schema with
    boolean ``exclusiveMinimum`` is not valid in 2020-12)."""
    import jsonschema

    v = jsonschema.validators
    if "$schema" in schema:
        candidates = [v.validator_for(schema)]
    else:
        candidates = [
            v.Draft202012Validator,
            v.Draft201909Validator,
            v.Draft7Validator,
            v.Draft6Validator,
            v.Draft4Validator,
        ]
    for cls in candidates:
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError:
            continue
        return cls
    raise invalid_format(schema)


def check_size(schema: Any, limits: SchemaLimits = LIMITS) -> None:
    """Refuse a schema too large or too deep to look at (before anything recurses)."""
    nodes, stack = 0, [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _too_large(f"the schema has more than {limits.max_nodes} values")
        if depth > limits.max_depth:
            raise _too_large(f"the schema is nested deeper than {limits.max_depth} levels")
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict | list):
            stack.extend((child, depth + 1) for child in children)
    if len(json.dumps(schema)) > limits.max_bytes:
        raise _too_large(f"the schema is larger than {limits.max_bytes} bytes as JSON")


def _too_large(what: str) -> InvalidRequest:
    return InvalidRequest(f"invalid format: {what}")


@dataclass
class _Costs:
    """What the grammar will spell out so far, against the limits."""

    limits: SchemaLimits
    repeats: int = 0
    optional: int = 0

    def repeat(self, count: int) -> None:
        self.repeats += count
        if self.repeats > self.limits.repeat_budget:
            raise _too_large(
                f"the schema's repeat counts (minLength, maxItems, {{m,n}} in patterns, ...) "
                f"add up to more than {self.limits.repeat_budget}"
            )

    def properties(self, optional: int, where: str) -> None:
        if optional > self.limits.max_optional:
            raise _too_large(
                f"the object at {where} has {optional} optional properties; at most "
                f"{self.limits.max_optional} (list more of them in required)"
            )
        self.optional += optional * optional
        if self.optional > self.limits.optional_budget:
            raise _too_large("the schema's objects have too many optional properties together")


def bounded_schema(schema: Any, limits: SchemaLimits = LIMITS) -> Any:
    """A copy of ``schema`` for the converter: counts above ``max_repeat``
    loosened (see the module), within the budgets or refused."""
    return _bound(schema, "$", _Costs(limits))


def _bound(schema: Any, where: str, costs: _Costs) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    _bound_counts(out, costs)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = _bound_pattern(out["pattern"], where, costs)
    properties = out.get("properties")
    if isinstance(properties, dict):
        required = out.get("required") if isinstance(out.get("required"), list) else []
        extra = 1 if out.get("additionalProperties", False) is not False else 0
        costs.properties(len(set(properties) - set(required)) + extra, where)
    if isinstance(out.get("allOf"), list):
        costs.properties(sum(_property_count(part) for part in out["allOf"]), where)
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {
                name: _bound(sub, f"{where}.{key}.{name}", costs) for name, sub in out[key].items()
            }
    for key in (*SUBSCHEMA_LISTS, "items"):
        if isinstance(out.get(key), list):
            out[key] = [_bound(sub, f"{where}.{key}[{i}]", costs) for i, sub in enumerate(out[key])]
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _bound(out[key], f"{where}.{key}", costs)
    return out


def _property_count(part: Any) -> int:
    """Properties an ``allOf`` part adds (its ``anyOf`` alternatives' too)."""
    if not isinstance(part, dict):
        return 0
    own = part.get("properties")
    count = len(own) if isinstance(own, dict) else 0
    if isinstance(part.get("anyOf"), list):
        count += sum(_property_count(alt) for alt in part["anyOf"])
    return count


def _bound_counts(schema: dict[str, Any], costs: _Costs) -> None:
    """Loosen minLength/maxLength and minItems/maxItems in place."""
    cap = costs.limits.max_repeat
    for low_key, high_key in (("minLength", "maxLength"), ("minItems", "maxItems")):
        low, high = _count(schema.get(low_key)), _count(schema.get(high_key))
        if high is not None and high > cap:
            del schema[high_key]
            high = None
        if low is not None and low > cap:
            schema[low_key] = low = cap
        if low is not None or high is not None:
            costs.repeat(high if high is not None else low or 0)


def _count(value: Any) -> int | None:
    """A JSON Schema count (an integer, possibly written as 5.0), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value)


# a repeat count, as json_grammar reads one after a "{"
_QUANTIFIER = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")


def _bound_pattern(pattern: str, where: str, costs: _Costs) -> str:
    """``pattern`` with every ``{m,n}`` above the cap loosened to ``{min(m, cap),}``.

    One pass, skipping escapes and character classes the way the converter
    reads them; a lone ``]`` or ``}`` is a literal."""
    if len(pattern) > costs.limits.max_pattern:
        raise _too_large(
            f"the pattern at {where} is longer than {costs.limits.max_pattern} characters"
        )
    cap = costs.limits.max_repeat
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
        elif ch == "[":
            end = i + 1
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            out.append(pattern[i : end + 1])
            i = end + 1
        elif ch == "{" and (m := _QUANTIFIER.match(pattern, i)):
            low = int(m[1] or 0)
            high = low if m[2] is None else (int(m[3]) if m[3] else None)
            if low > cap or (high is not None and high > cap):
                low, high = min(low, cap), None
                out.append(f"{{{low},}}")
            else:
                out.append(m[0])
            costs.repeat(high if high is not None else low)
            i = m.end()
        else:
            out.append(ch)
            i += 1
    return "".join(out)


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
        jsonschema.validate(value, fmt.schema, cls=fmt.validator)
    except jsonschema.ValidationError as e:
        return f"output does not match the schema: {e.message}"
    return None
