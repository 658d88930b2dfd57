"""``format``: structured outputs as llama.cpp grammars (BEHAVIOUR.md, API).

Missing, null and "" mean no constraint; "json" is any JSON object; an object
is a JSON Schema, checked against its meta-schema and converted to a grammar
(``jupyter_llm.grammar``) before anything is scheduled. Every valid schema is
accepted: what the grammar cannot enforce is ignored, as Ollama does, and
logged at DEBUG; the output is checked against the schema afterwards
(``check_output``).

What a schema may make the converter build is bounded (``SchemaLimits``, its
values from ``jupyter_llm.request.limits``): its size, nesting, optional properties,
the repeats it spells out, and the grammar's width: enum and const values
(and their characters) and ``anyOf``/``oneOf``/``type``-list branches, each
a stack llama.cpp's sampler tracks at every token. A schema beyond them is a
400 naming the field (``format``, ``response_format``,
``tools[3].function.parameters``) and the limit. Tools form one grammar, so
their parameters together get one schema's budget (``check_tools``). A count
above ``max_repeat`` (``maxLength``, ``maxItems``, ``{m,n}`` in a
``pattern``...) is not spelled out: "at most 2^31" is treated as unbounded,
"at least 2^31" as "at least max_repeat".
The grammar is then looser than the schema; the output is still checked
against the schema as sent. Parsing a format is CPU work: handlers run it
off the event loop.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from jupyter_llm.grammar.check import OutputFormat
from jupyter_llm.grammar.gbnf import GrammarBudget, GrammarTooLarge
from jupyter_llm.grammar.json_schema import json_object_grammar, schema_to_grammar, short_name
from jupyter_llm.grammar.llama_rules import repetition_refusal
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import (
    ENUM_CHARS,
    ENUM_VALUES,
    SCHEMA_ALTERNATIVES,
    SCHEMA_BYTES,
    SCHEMA_DEPTH,
    SCHEMA_NODES,
    SCHEMA_OPTIONAL,
    SCHEMA_PATTERN,
    SCHEMA_REPEAT_CAP,
    SCHEMA_REPEATS,
    TOOLS,
    Limit,
)

SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


@dataclass(frozen=True)
class SchemaLimits:
    """What one grammar's schema (a ``format``, or every tool's parameters
    together) may ask of the grammar converter and the sampler."""

    max_bytes: int = SCHEMA_BYTES.value  # the schema as JSON
    max_nodes: int = SCHEMA_NODES.value  # values in it: objects, lists and scalars
    max_depth: int = SCHEMA_DEPTH.value  # their nesting
    max_repeat: int = SCHEMA_REPEAT_CAP  # a count above this is not spelled out
    repeat_budget: int = SCHEMA_REPEATS.value  # counts spelled out, all together
    # optional properties per object, and their square summed over objects
    # (the bound of llama-cpp-python's converter, whose rules grew with that
    # square; ours grow linearly, the refusal is kept)
    max_optional: int = SCHEMA_OPTIONAL.value
    optional_budget: int = 4 * SCHEMA_OPTIONAL.value**2
    max_pattern: int = SCHEMA_PATTERN.value  # characters in one ``pattern``
    # the grammar's width: values of all enums and consts, their characters,
    # and anyOf/oneOf/type-list branches, all together
    max_enum_values: int = ENUM_VALUES.value
    max_enum_chars: int = ENUM_CHARS.value
    max_alternatives: int = SCHEMA_ALTERNATIVES.value

    def budget(self) -> GrammarBudget:
        """The converter's budget for one grammar under these limits."""
        return GrammarBudget(
            max_repeat=self.max_repeat,
            repeats=self.repeat_budget,
            alternatives=self.max_alternatives,
            visits=self.max_nodes,
        )


LIMITS = SchemaLimits()
# formats kept built, by their schema's JSON; at most this many times a schema
# at SCHEMA_BYTES and its grammar (about 2 MiB each) stay in memory
FORMATS_CACHED = 16
COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


def invalid_format(value: object) -> InvalidRequest:
    return InvalidRequest(
        f'invalid format: {json.dumps(value)}; expected "json" or a valid JSON Schema object'
    )


def parse_format(value: object, field: str = "format") -> OutputFormat | None:
    """The constraint a request's ``format`` asks for, or None. ``field``:
    where the schema is in the request, for the 400s (``response_format``)."""
    if value is None or value == "":
        return None
    if value == "json":
        return OutputFormat(grammar=json_object_grammar())
    if not isinstance(value, dict):
        raise invalid_format(value)
    check_size(value, field=field)
    return _schema_format(json.dumps(value), field)


@functools.lru_cache(maxsize=FORMATS_CACHED)
def _schema_format(text: str, field: str) -> OutputFormat:
    """The format for a schema (as JSON ``text``, already within its size
    limits): built once for a schema sent again, as a client that reuses
    one schema for every request does. Refusals are not kept."""
    value = json.loads(text)
    validator = schema_dialect(value)
    bounded = bounded_schema(value, field=field)
    try:
        grammar = schema_to_grammar(bounded, LIMITS.budget())
    except RecursionError:  # e.g. an allOf that includes itself
        raise _refused(field, "the schema's allOf/anyOf nest without end") from None
    except GrammarTooLarge as e:  # a $ref or merge spelled out more than the schema shows
        raise _over(field, e.limit, e.limit.value, e.got, "as its grammar spells it out") from None
    if why := repetition_refusal(grammar):  # llama.cpp would refuse it, after a load
        raise _refused(field, f"its grammar nests repeats past llama.cpp's bound: {why}")
    return OutputFormat(grammar=grammar, schema=value, validator=validator)


def check_tools(tools: list[dict[str, Any]], limits: SchemaLimits = LIMITS) -> None:
    """Refuse tools whose parameter schemas the grammar could not hold: each
    within ``limits``, and all together too (a tool-call grammar holds every
    offered tool's), no more than ``TOOLS`` of them. Cheap: nothing is
    converted here (the runner builds the grammar), so it may run on the loop."""
    _check(TOOLS, TOOLS.value, "tools", len(tools), "too many tools")
    total = Measured(limits)
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        params = function.get("parameters") if isinstance(function, dict) else None
        if not isinstance(params, dict):
            continue
        field = f"tools[{i}].function.parameters"
        own = measure_schema(params, field, limits)
        own.costs = _bound_costs(params, field, limits)
        own.check(field)
        total.add(own)
        total.check(f"{field} with the tools before it")


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
        except RecursionError:  # a regex of a thousand nested groups, compiled by the check
            raise InvalidRequest(
                "invalid format: the schema nests too deep to be checked (a pattern's groups?)"
            ) from None
        return cls
    raise invalid_format(schema)


# keys whose value maps names to schemas: its keys are names, not keywords
NAME_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
# keys whose value is data (an instance), not a schema
DATA_KEYS = ("enum", "const", "default", "examples")


@dataclass
class Measured:
    """What a schema (or several, ``add``ed) will make of one grammar."""

    limits: SchemaLimits = LIMITS
    nodes: int = 0
    bytes: int = 0
    enum_values: int = 0
    enum_chars: int = 0
    alternatives: int = 0
    costs: _Costs | None = None  # repeats and optional properties, from ``_bound``

    def add(self, other: Measured) -> None:
        self.nodes += other.nodes
        self.bytes += other.bytes
        self.enum_values += other.enum_values
        self.enum_chars += other.enum_chars
        self.alternatives += other.alternatives
        if other.costs is not None:
            if self.costs is None:
                self.costs = _Costs(self.limits, "")
            self.costs.repeats += other.costs.repeats
            self.costs.optional += other.costs.optional

    def check(self, field: str) -> None:
        """Refuse what goes over a limit, naming ``field`` and the limit."""
        lim = self.limits
        _check(SCHEMA_NODES, lim.max_nodes, field, self.nodes, "the schema is too large")
        _check(SCHEMA_BYTES, lim.max_bytes, field, self.bytes, "the schema is too large")
        _check(ENUM_VALUES, lim.max_enum_values, field, self.enum_values, "too many enum values")
        _check(ENUM_CHARS, lim.max_enum_chars, field, self.enum_chars, "enum values too long")
        _check(
            SCHEMA_ALTERNATIVES,
            lim.max_alternatives,
            field,
            self.alternatives,
            "too many anyOf/oneOf/type branches",
        )
        if self.costs is not None:
            self.costs.field = field
            self.costs.repeat(0)
            self.costs.add_optional(0)


def measure_schema(schema: Any, field: str, limits: SchemaLimits = LIMITS) -> Measured:
    """Measure ``schema`` in one pass without recursion, refusing it as soon
    as it is too large or too deep to look at (before anything recurses or
    ``json.dumps`` a huge value); the width is checked by ``Measured.check``.

    Every value is walked, not only where the converter looks, since a
    ``$ref`` may point anywhere in the document. Enum and const values are
    data: counted, not searched for keywords; names in ``properties`` and the
    like are not keywords either."""
    out = Measured(limits)
    size = 0  # JSON bytes, at least: the exact count below once it is small
    stack: list[tuple[Any, int, str]] = [(schema, 1, "schema")]  # kind: schema, names, data
    enums: list[Any] = []
    while stack:
        value, depth, kind = stack.pop()
        out.nodes += 1
        if out.nodes > limits.max_nodes:
            raise _over(field, SCHEMA_NODES, limits.max_nodes, None, "the schema is too large")
        if depth > limits.max_depth:
            raise _over(field, SCHEMA_DEPTH, limits.max_depth, None, "nested too deep")
        if isinstance(value, dict):
            size += 2 + sum(len(k) + 4 for k in value)
            if kind == "schema":
                for key in ("anyOf", "oneOf", "type"):
                    if isinstance(value.get(key), list):
                        out.alternatives += len(value[key])
                if isinstance(value.get("enum"), list):
                    enums.extend(value["enum"])
                if "const" in value:
                    enums.append(value["const"])
            for key, child in value.items():
                child_kind = (
                    "data"
                    if kind == "data" or (kind == "schema" and key in DATA_KEYS)
                    else "names"
                    if kind == "schema" and key in NAME_MAPS
                    else "schema"
                )
                stack.append((child, depth + 1, child_kind))
        elif isinstance(value, list):
            size += 2 + len(value)
            stack.extend((child, depth + 1, kind) for child in value)
        else:
            size += len(value) + 2 if isinstance(value, str) else 4
        if size > limits.max_bytes:
            raise _over(field, SCHEMA_BYTES, limits.max_bytes, None, "the schema is too large")
    out.bytes = len(json.dumps(schema))
    _check(SCHEMA_BYTES, limits.max_bytes, field, out.bytes, "the schema is too large")
    out.enum_values = len(enums)
    out.enum_chars = sum(
        len(v) if isinstance(v, str) else len(json.dumps(v, separators=(",", ":"))) for v in enums
    )
    return out


def check_size(schema: Any, limits: SchemaLimits = LIMITS, field: str = "format") -> None:
    """Refuse a schema too large, too deep or too wide for one grammar."""
    measure_schema(schema, field, limits).check(field)


def _root(field: str) -> str:
    return re.split(r"[.\[ ]", field, maxsplit=1)[0]


def _refused(field: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"invalid {_root(field)}: {what}")


def _over(field: str, limit: Limit, value: int, got: int | None, what: str) -> InvalidRequest:
    """The 400 for ``field`` over ``limit`` (applied with ``value``)."""
    error = replace(limit, value=value).exceeded(field, got)
    return _refused(field, f"{what}: {error}")


def _check(limit: Limit, value: int, field: str, got: int, what: str) -> None:
    if got > value:
        raise _over(field, limit, value, got, what)


@dataclass
class _Costs:
    """What the grammar will spell out so far, against the limits."""

    limits: SchemaLimits
    field: str
    repeats: int = 0
    optional: int = 0

    def repeat(self, count: int) -> None:
        self.repeats += count
        _check(
            SCHEMA_REPEATS,
            self.limits.repeat_budget,
            self.field,
            self.repeats,
            "repeat counts (minLength, maxItems, {m,n} in patterns, ...) add up too high",
        )

    def properties(self, optional: int, where: str) -> None:
        _check(
            SCHEMA_OPTIONAL,
            self.limits.max_optional,
            f"{self.field} at {where}",
            optional,
            "too many optional properties in one object (list more of them in required)",
        )
        self.add_optional(optional * optional)

    def add_optional(self, squared: int) -> None:
        self.optional += squared
        if self.optional > self.limits.optional_budget:
            raise _refused(
                self.field,
                f"the schema's objects have too many optional properties together: the sum "
                f"of their squares is {self.optional:,}; the limit is "
                f"{self.limits.optional_budget:,} (4 x schema_optional squared)",
            )


def bounded_schema(schema: Any, limits: SchemaLimits = LIMITS, field: str = "format") -> Any:
    """A copy of ``schema`` for the converter: counts above ``max_repeat``
    loosened (see the module), within the budgets or refused."""
    return _bound(schema, "$", _Costs(limits, field))


def _bound_costs(schema: Any, field: str, limits: SchemaLimits) -> _Costs:
    """What ``schema``'s grammar spells out (repeats, optional properties)."""
    costs = _Costs(limits, field)
    _bound(schema, "$", costs)
    return costs


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
                name: _bound(sub, f"{where}.{key}.{short_name(name)}", costs)
                for name, sub in out[key].items()
            }
    for key in (*SUBSCHEMA_LISTS, "items"):
        if isinstance(out.get(key), list):
            out[key] = [_bound(sub, f"{where}.{key}[{i}]", costs) for i, sub in enumerate(out[key])]
    for key in ("items", "additionalProperties", "additionalItems"):
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


# a repeat count, as the grammar reads one after a "{"
_QUANTIFIER = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")


def _bound_pattern(pattern: str, where: str, costs: _Costs) -> str:
    """``pattern`` with every ``{m,n}`` above the cap loosened to ``{min(m, cap),}``.

    One pass, skipping escapes and character classes the way the converter
    reads them; a lone ``]`` or ``}`` is a literal. Groups may nest
    ``max_depth`` deep."""
    _check(
        SCHEMA_PATTERN,
        costs.limits.max_pattern,
        f"{costs.field} at {where}",
        len(pattern),
        "a pattern too long",
    )
    cap = costs.limits.max_repeat
    out, i, depth = [], 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "(":  # the converter reads groups recursively
            depth += 1
            _check(
                SCHEMA_DEPTH,
                costs.limits.max_depth,
                f"{costs.field} at {where}",
                depth,
                "a pattern's groups nested too deep",
            )
        elif ch == ")":
            depth = max(depth - 1, 0)
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
