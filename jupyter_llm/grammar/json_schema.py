"""JSON Schema -> GBNF, llama.cpp's grammar language: one job, pure functions.

Every grammar here produces RFC 8259 JSON: strings never hold a raw control
character (U+0000..U+001F), and their escapes are JSON's own (\\" \\\\ \\/ \\b
\\f \\n \\r \\t \\uXXXX). A schema grammar produces a subset of the values the
schema accepts, as tight as a context-free grammar allows:

- objects: properties in the schema's order, required ones always present;
  without ``additionalProperties`` an object with ``properties`` is closed
  (as llama.cpp does), an empty one too (``{}`` only: a tool without
  arguments, whose caller calls ``f(**args)``), otherwise extra keys, none
  of them a listed one, follow the listed ones;
- arrays: ``items``, ``prefixItems`` (or draft-4 list ``items``),
  ``minItems``/``maxItems``;
- strings: ``minLength``/``maxLength``, ``pattern`` (a regular-expression
  subset: no lookaround, backreferences or word boundaries), ``format``
  (``FORMATS``); with a ``pattern`` or ``format`` the lengths are not enforced;
- integers: ``minimum``/``maximum`` and both forms of the exclusive bounds,
  exactly, by digit ranges;
- numbers with bounds: written without an exponent, and the bounds are exact
  on the decimal digits (a value that only rounds past a bound as a binary
  float can slip through);
- ``enum``, ``const``, ``anyOf``/``oneOf`` (one of the alternatives, not
  "exactly one"), ``allOf`` (merged), ``type`` lists, local ``$ref``s
  (recursion included). Enum and const values (an ``anyOf`` of them too) are
  written as one prefix tree of their JSON texts: llama.cpp's grammar keeps a
  stack per alternative still matching, so look-alike values listed side by
  side cost the square of their number at every character; in a tree they
  share their states.

What a grammar spells out is bounded (``GrammarBudget``, from
``jupyter_llm.request.limits``) wherever it comes from, a ``$ref`` into any part of
the document and ``allOf``/``anyOf`` merges included: a count above
``SCHEMA_REPEAT_CAP`` is left open (the output is validated after), and
counts spelled out, ``anyOf``/``oneOf``/``type`` branches and schemas visited
are budgeted; going over raises ``GrammarTooLarge``.

Keywords the grammar cannot enforce (``not``, ``multipleOf``, ``uniqueItems``,
``patternProperties``, ``if``, ...) are ignored and logged at DEBUG with where
they are; the caller validates the output against the schema afterwards.
Digit runs without a bound are capped (an integer at 16 digits, a fraction at
20, an exponent at 3) so that a model cannot run away in them; bounds are
rounded outwards to 40 digits each side of the point.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.grammar.gbnf import (
    PRIMITIVES,
    STRING_ESCAPE,
    GrammarBudget,
    alternatives,
    char_class,
    enum_expr,
    group,
    json_literal,
    literal,
    repeat,
    seq,
)
from jupyter_llm.grammar.numbers import (
    MAX_BOUND_DIGITS,
    Bound,
    bounds,
    coarse,
    empty_range,
    integer_bounds,
    integer_range,
    number_range,
)
from jupyter_llm.grammar.regex import UnsupportedPattern, normalise_ranges, pattern_expr
from jupyter_llm.request.limits import (
    SCHEMA_ALTERNATIVES,
    SCHEMA_NODES,
)

log = logging.getLogger(__name__)


FORMATS = {"date", "time", "date-time", "uuid", "ipv4", "hostname", "email", "uri"}
FORMAT_ALIASES = {f"uuid{n}": "uuid" for n in range(1, 6)}

ANNOTATIONS = {
    "title",
    "description",
    "$schema",
    "$id",
    "id",
    "$comment",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
    "deprecated",
    "contentEncoding",
    "contentMediaType",
    "discriminator",  # OpenAPI, emitted by pydantic for tagged unions
}
ENFORCED = {
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
}
TYPE_HINTS = (  # a schema without "type": the first family whose keywords it uses
    ("object", ("properties", "additionalProperties", "required")),
    ("array", ("items", "prefixItems", "minItems", "maxItems")),
    ("string", ("pattern", "minLength", "maxLength", "format")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
)


# characters of a hint kept for a rule's name; of a name kept in a path (``where``)
HINT_CHARS = 48
NAME_CHARS = 40


def short_name(name: str) -> str:
    """A property's name as a path shows it: a name may be kilobytes long,
    and a path holds every name above it."""
    return name if len(name) <= NAME_CHARS else f"{name[: NAME_CHARS - 3]}..."


def ignored(keyword: str, where: str, why: str = "not enforced by the grammar") -> None:
    log.debug(
        "format: JSON Schema %s at %s is %s; the output is validated after", keyword, where, why
    )


def enum_values(schema: dict[str, Any]) -> list[Any] | None:
    """The values a schema allows by ``const`` or ``enum`` alone (as ``visit``
    reads them: a ``$ref`` first, then ``const``, then ``enum``), or None."""
    if "$ref" in schema:
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return None


# -- schemas -----------------------------------------------------------------------------------
def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra``'s constraints added to ``base`` (properties and required joined)."""
    out = dict(base)
    for key, value in extra.items():
        if key == "properties" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif key == "required" and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key in ("$defs", "definitions"):
            continue  # resolved against the root
        else:
            out[key] = value
    return out


def _pointer(root: Any, ref: str) -> Any:
    """The local ``$ref`` target, or raise KeyError."""
    from urllib.parse import unquote

    if not ref.startswith("#"):
        raise KeyError(ref)
    node = root
    for token in filter(None, unquote(ref[1:]).split("/")):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise KeyError(ref)
    return node


@dataclass
class Converter:
    """One schema into one grammar: rules by name, one rule per ``$ref``."""

    root: Any
    rules: dict[str, str] = field(default_factory=dict)
    _names: dict[str, str] = field(default_factory=dict)  # rule body -> name
    _refs: dict[str, str] = field(default_factory=dict)
    _merging: set[str] = field(default_factory=set)  # $refs an allOf is merging now
    _head: set[str] = field(default_factory=set)  # $refs entered since the last character
    _numbered: dict[str, int] = field(default_factory=dict)  # a name's last number
    budget: GrammarBudget = field(default_factory=GrammarBudget)

    def grammar(self) -> str:
        self.rules["root"] = self.visit(self.root, "$", "root")
        return "\n".join(f"{name} ::= {body}" for name, body in sorted(self.rules.items())) + "\n"

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            body, uses = PRIMITIVES[name]
            self.rules[name] = body
            for used in uses:
                self.primitive(used)
        return name

    def rule(self, hint: str, body: str) -> str:
        if body in self._names:
            return self._names[body]
        name = self._fresh(hint)
        self.rules[name] = body
        self._names[body] = name
        return name

    def _fresh(self, hint: str) -> str:
        """A new rule's name: from the end of ``hint`` (the most specific part,
        at most ``HINT_CHARS``: names are spelled at every use), numbered
        where taken."""
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", hint[-HINT_CHARS:]).strip("-").lower() or "r"
        if base in PRIMITIVES or base == "root":
            base += "-x"
        name, n = base, self._numbered.get(base, 1)
        while name in self.rules:
            n += 1
            name = f"{base}-{n}"
        self._numbered[base] = n
        self.rules[name] = ""  # reserved
        return name

    # - dispatch -
    def visit(self, schema: Any, where: str, hint: str) -> str:
        hint = hint[-HINT_CHARS:]  # a property's name may be kilobytes long
        self.budget.spend(SCHEMA_NODES, self.budget.visits, 1)
        if schema is True or schema == {}:
            return self.primitive("value")
        if not isinstance(schema, dict):
            ignored("false", where, "unsatisfiable; any value is generated")
            return self.primitive("value")
        for key in schema:
            if key not in ENFORCED and key not in ANNOTATIONS:
                ignored(repr(key), where)
        if "$ref" in schema:
            for key in schema:
                if key in ENFORCED and key not in ("$ref", "$defs", "definitions"):
                    ignored(repr(key), where, "beside a $ref, not enforced")
            return self.ref(schema["$ref"], where)
        values = enum_values(schema)
        if values is not None:
            return self.enum(values, where, hint)
        if isinstance(schema.get("allOf"), list):
            return self.all_of(schema, where, hint)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.any_of(schema, key, where, hint)
        kind = schema.get("type")
        if isinstance(kind, list):
            self.budget.spend(SCHEMA_ALTERNATIVES, self.budget.alternatives, len(kind))
            options = [self.visit({**schema, "type": t}, where, f"{hint}-{t}") for t in kind]
            return self.rule(hint, alternatives(options)) if options else self.primitive("value")
        if kind is None:
            kind = next((k for k, keys in TYPE_HINTS if any(key in schema for key in keys)), None)
        build: dict[Any, Callable[[dict[str, Any], str, str], str]] = {
            "object": self.object,
            "array": self.array,
            "string": self.string,
            "integer": self.integer,
            "number": self.number,
        }
        if kind in build:
            return build[kind](schema, where, hint)
        if kind in ("boolean", "null"):
            return self.primitive(kind)
        return self.primitive("value")

    def all_of(self, schema: dict[str, Any], where: str, hint: str) -> str:
        """``allOf``'s parts merged into one schema; a ``$ref`` already being
        merged here is skipped (a recursive merge would not end)."""
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        refs = []
        for i, part in enumerate(schema["allOf"]):
            ref = part.get("$ref") if isinstance(part, dict) else None
            if ref in self._merging:
                ignored(f"$ref {ref!r}", f"{where}.allOf[{i}]", "already merged here")
                continue
            if isinstance(ref, str):
                refs.append(ref)
            merged = _merge(merged, self.resolved(part, f"{where}.allOf[{i}]"))
        self._merging.update(refs)
        try:
            return self.visit(merged, where, hint)
        finally:
            self._merging.difference_update(refs)

    def any_of(self, schema: dict[str, Any], key: str, where: str, hint: str) -> str:
        """One of ``anyOf``'s (or ``oneOf``'s) alternatives, each merged with the
        rest of the schema; alternatives that are all consts make one tree."""
        base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        self.budget.spend(SCHEMA_ALTERNATIVES, self.budget.alternatives, len(schema[key]))
        subs = [_merge(base, alt) if isinstance(alt, dict) else alt for alt in schema[key]]
        each = [enum_values(sub) if isinstance(sub, dict) else None for sub in subs]
        if all(v is not None for v in each):  # one of several consts: one tree
            return self.enum([v for vs in each for v in vs or ()], where, hint)
        options = [
            self.visit(sub, f"{where}.{key}[{i}]", f"{hint}-{i}") for i, sub in enumerate(subs)
        ]
        return self.rule(hint, alternatives(options))

    def enum(self, values: list[Any], where: str, hint: str) -> str:
        """One of ``values`` (``const`` or ``enum``), as a prefix tree."""
        expr = enum_expr(values)
        if expr is None:
            ignored("enum []", where, "unsatisfiable; any value is generated")
            return self.primitive("value")
        self.primitive("space")
        return self.rule(hint, seq(expr, "space"))

    def resolved(self, schema: Any, where: str) -> dict[str, Any]:
        """``schema`` with a ``$ref`` at its top followed (for merging)."""
        seen = set()
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            ref = schema["$ref"]
            if ref in seen:
                break
            seen.add(ref)
            try:
                target = _pointer(self.root, ref)
            except KeyError:
                ignored(f"$ref {ref!r}", where, "not a local reference")
                return {}
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = _merge(target, rest) if isinstance(target, dict) else target
        return schema if isinstance(schema, dict) else {}

    def ref(self, ref: Any, where: str) -> str:
        if not isinstance(ref, str):
            return self.primitive("value")
        if ref in self._head:  # a cycle that reads nothing: no grammar may hold it
            ignored(f"$ref {ref!r}", where, "a cycle of references; any value is generated")
            return self.primitive("value")
        if ref in self._refs:
            return self._refs[ref]
        try:
            target = _pointer(self.root, ref)
        except KeyError:
            ignored(f"$ref {ref!r}", where, "not a local reference; any value is generated")
            return self.primitive("value")
        name = self._fresh(ref.rsplit("/", 1)[-1] or "root-ref")
        self._refs[ref] = name
        self._head.add(ref)
        try:
            self.rules[name] = self.visit(target, ref, name + "-body")
        finally:
            self._head.discard(ref)
        return name

    def inside(self, build: Callable[[], str]) -> str:
        """``build()`` for what follows an opening "{" or "[": references
        made there are no longer at the head of a rule."""
        head, self._head = self._head, set()
        try:
            return build()
        finally:
            self._head = head

    # - one rule per kind -
    def object(self, schema: dict[str, Any], where: str, hint: str) -> str:
        return self.inside(lambda: self._object(schema, where, hint))

    def _object(self, schema: dict[str, Any], where: str, hint: str) -> str:
        listed = isinstance(schema.get("properties"), dict)  # even empty: a tool without arguments
        properties = schema["properties"] if listed else {}
        required = [r for r in schema.get("required", []) if isinstance(r, str)]
        extra = schema.get("additionalProperties")
        if (
            not properties
            and not required
            and (extra in (True, {}) or (extra is None and not listed))
        ):
            return self.primitive("object")
        self.primitive("space")
        entries: list[tuple[str, bool]] = []  # (rule, required)
        for name, sub in properties.items():
            if sub is False:
                continue
            value = self.visit(sub, f"{where}.properties.{short_name(name)}", f"{hint}-{name}")
            kv = seq(json_literal(name), "space", '":"', "space", value)
            entries.append((self.rule(f"{hint}-{name}-kv", kv), name in required))
        for name in required:
            if name not in properties:  # required, but only additionalProperties describes it
                sub = extra if isinstance(extra, dict) else True
                value = self.visit(sub, f"{where}.additionalProperties", f"{hint}-{name}")
                kv = seq(json_literal(name), "space", '":"', "space", value)
                entries.append((self.rule(f"{hint}-{name}-kv", kv), True))
        extra_kv = None
        if extra not in (None, False):
            value = self.visit(extra, f"{where}.additionalProperties", f"{hint}-extra")
            key = self.other_key([n for n in properties if properties[n] is not False] + required)
            extra_kv = self.rule(f"{hint}-extra-kv", seq(key, '":"', "space", value))
        # rest[i]: the entries from i on, each after a comma; first[i]: the
        # same with the first one present written without its comma
        rest = f'("," space {extra_kv})*' if extra_kv else ""
        first = f'({extra_kv} ("," space {extra_kv})*)?' if extra_kv else ""
        for i in range(len(entries) - 1, -1, -1):
            kv, needed = entries[i]
            after = self.rule(f"{hint}-after-{i}", rest) if rest else ""
            comma = seq('","', "space", kv)
            rest = seq(comma if needed else f"({comma})?", after)
            own = seq(kv, after)
            if needed:
                first = own
            else:
                first = f"{own} | {first}" if first else f"({own})?"
            first = self.rule(f"{hint}-from-{i}", first)
        return self.rule(hint, seq('"{"', "space", first, '"}"', "space"))

    def other_key(self, names: list[str]) -> str:
        """A key (a JSON string, then space) that is none of ``names``, so that
        an extra property never repeats a listed one. Names JSON writes with
        escapes are left out of the check (post-validation covers them)."""
        self.primitive("space")
        self.primitive("char")
        trie: dict[str, Any] = {}
        for name in dict.fromkeys(names):
            if any(ord(ch) < 0x20 or ch in '"\\' for ch in name):
                continue
            node = trie
            for ch in name:
                node = node.setdefault(ch, {})
            node[""] = {}  # a name ends here
        if not trie:
            return self.primitive("string")
        counter = [0]

        def rest(node: dict[str, Any]) -> str:
            children = sorted(ch for ch in node if ch)
            cut = [(ord(ch), ord(ch)) for ch in children] + [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
            other = alternatives([char_class(normalise_ranges(cut), True), STRING_ESCAPE])
            options = [seq(literal(ch), rest(node[ch])) for ch in children]
            options.append(seq(group(other), "char*"))
            body = " | ".join(options)
            if "" not in node:  # the key may end here: it is a proper prefix of a name
                body = f"({body})?"
            counter[0] += 1
            return self.rule(f"key-{counter[0]}", body)

        return self.rule("key", seq(r'"\""', rest(trie), r'"\""', "space"))

    def array(self, schema: dict[str, Any], where: str, hint: str) -> str:
        return self.inside(lambda: self._array(schema, where, hint))

    def _array(self, schema: dict[str, Any], where: str, hint: str) -> str:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft 4-2019 tuples
            prefix, items = items, schema.get("additionalItems")
        prefix = prefix if isinstance(prefix, list) else []
        low = _count(schema.get("minItems")) or 0
        high = _count(schema.get("maxItems"))
        self.primitive("space")
        if high is not None and high < low:
            ignored("minItems/maxItems", where, "unsatisfiable; the lengths are not enforced")
            low, high = 0, None
        low, high = self.budget.capped(low, high)
        if "minItems" in schema or "maxItems" in schema:
            self.budget.repeat(low, high)
        parts = [
            self.visit(sub, f"{where}.prefixItems[{i}]", f"{hint}-{i}")
            for i, sub in enumerate(prefix)
        ]
        if high is not None:
            parts = parts[:high]
        more_low = max(low - len(parts), 0)
        more_high = None if high is None else high - len(parts)
        if prefix and items is None:  # open, but a tuple is written without extras
            items, more_high = (True if more_low else False), more_low
        element = (
            None
            if items is False
            else self.visit(items if items is not None else True, f"{where}.items", f"{hint}-item")
        )
        if element is None:
            more_low = more_high = 0
        pieces = []
        for i, part in enumerate(parts):
            pieces.append(part if i == 0 else seq('","', "space", part))
        body = seq(*pieces)
        if element is not None and more_high != 0:
            if parts:
                body = seq(body, repeat(seq('","', "space", element), more_low, more_high))
            else:
                tail = repeat(
                    seq('","', "space", element),
                    max(more_low - 1, 0),
                    None if more_high is None else more_high - 1,
                )
                run = seq(element, tail)
                body = run if more_low >= 1 else f"({run})?"
        return self.rule(hint, seq('"["', "space", body, '"]"', "space"))

    def string(self, schema: dict[str, Any], where: str, hint: str) -> str:
        self.primitive("space")
        self.primitive("char")
        lengths = "minLength" in schema or "maxLength" in schema
        fmt = schema.get("format")
        fmt = FORMAT_ALIASES.get(fmt, fmt)
        inner = None
        if isinstance(schema.get("pattern"), str):
            try:
                inner = pattern_expr(schema["pattern"], self.budget)
            except UnsupportedPattern as e:
                ignored(f"pattern {schema['pattern']!r}", where, f"not expressible ({e})")
            if inner is not None and fmt is not None:
                ignored(f"format {fmt!r}", where, "beside a pattern, not enforced")
        if inner is None and fmt is not None:
            if fmt in FORMATS:
                inner = self.primitive(fmt)
            else:
                ignored(f"format {fmt!r}", where)
        if inner is not None:
            if lengths:
                ignored("minLength/maxLength", where, "beside a pattern or format, not enforced")
            return self.rule(hint, seq(r'"\""', inner, r'"\""', "space"))
        low = _count(schema.get("minLength")) or 0
        high = _count(schema.get("maxLength"))
        if high is not None and high < low:
            ignored("minLength/maxLength", where, "unsatisfiable; not enforced")
            low, high = 0, None
        low, high = self.budget.capped(low, high)
        if lengths:
            self.budget.repeat(low, high)
        return self.rule(hint, seq(r'"\""', repeat("char", low, high), r'"\""', "space"))

    @staticmethod
    def bounds(schema: dict[str, Any], where: str) -> tuple[Bound | None, Bound | None]:
        exact = bounds(schema)
        low, high = coarse(exact[0], True), coarse(exact[1], False)
        if (low, high) != exact:
            ignored("minimum/maximum", where, f"beyond {MAX_BOUND_DIGITS} digits, rounded outwards")
        return low, high

    def integer(self, schema: dict[str, Any], where: str, hint: str) -> str:
        low, high = self.bounds(schema, where)
        if low is None and high is None:
            return self.primitive("integer")
        lo, hi = integer_bounds(low, high)
        self.primitive("space")
        if lo is not None and hi is not None and lo > hi:
            ignored("minimum/maximum", where, "unsatisfiable for an integer; not enforced")
            return self.primitive("integer")
        return self.rule(hint, seq(integer_range(lo, hi), "space"))

    def number(self, schema: dict[str, Any], where: str, hint: str) -> str:
        low, high = self.bounds(schema, where)
        if low is None and high is None:
            return self.primitive("number")
        expr = None if empty_range(low, high) else number_range(low, high)
        if expr is None:
            ignored("minimum/maximum", where, "unsatisfiable; not enforced")
            return self.primitive("number")
        self.primitive("space")
        return self.rule(hint, seq(expr, "space"))


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return max(int(value), 0)


def schema_to_grammar(schema: Any, budget: GrammarBudget | None = None) -> str:
    """The GBNF grammar (start rule ``root``) for a JSON Schema, within
    ``budget`` (the limits' defaults when None)."""
    return Converter(schema, budget=budget or GrammarBudget()).grammar()


def json_object_grammar() -> str:
    """``format: "json"``: any JSON object."""
    return schema_to_grammar({"type": "object"})
