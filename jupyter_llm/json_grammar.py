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

import json
import logging
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation, localcontext
from typing import Any

from jupyter_llm.request.limits import (
    SCHEMA_ALTERNATIVES,
    SCHEMA_NODES,
    SCHEMA_REPEAT_CAP,
    SCHEMA_REPEATS,
    Limit,
)

log = logging.getLogger(__name__)

MAX_DIGITS = 16  # digits of an integer or of a run without bounds
MAX_FRACTION = 20  # digits after the point: any float's repr fits
MAX_EXPONENT_DIGITS = 3
MAX_BOUND_DIGITS = 40  # a bound is rounded outwards to this many digits each side of the point

# a JSON string's escape; it needs the primitive u-hex
_ESCAPE = r'"\\" (["\\/bfnrt] | "u" u-hex)'
# the primitives every grammar may use, and the primitives each one uses
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": ('" "?', ()),
    # a "\u" escape never writes a lone surrogate (json.loads would give one):
    # a pair is one character, as Python counts it; or the character is raw UTF-8
    "char": (r'[^"\\\x00-\x1F] | ' + _ESCAPE, ("u-hex",)),
    "u-hex": (
        r"[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} "
        r'| [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}',
        (),
    ),
    "string": (r'"\"" char* "\"" space', ("char", "space")),
    "int-digits": (f'"0" | [1-9] [0-9]{{0,{MAX_DIGITS - 1}}}', ()),
    "integer": ('"-"? int-digits space', ("int-digits", "space")),
    "number": (
        f'"-"? int-digits ("." [0-9]{{1,{MAX_FRACTION}}})? '
        f"([eE] [-+]? [0-9]{{1,{MAX_EXPONENT_DIGITS}}})? space",
        ("int-digits", "space"),
    ),
    "boolean": ('("true" | "false") space', ("space",)),
    "null": ('"null" space', ("space",)),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (
        '"{" space (string ":" space value ("," space string ":" space value)*)? "}" space',
        ("string", "value", "space"),
    ),
    "array": ('"[" space (value ("," space value)*)? "]" space', ("value", "space")),
    # string formats, the text between the quotes
    "date": ('[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])', ()),
    "time": (
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
        '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
        (),
    ),
    "date-time": ('date "T" time', ("date", "time")),
    "uuid": (' "-" '.join(f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12)), ()),
    "ipv4": ('ipv4-octet ("." ipv4-octet){3}', ("ipv4-octet",)),
    "ipv4-octet": ('"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9]{2} | [1-9]? [0-9]', ()),
    "hostname": ('host-label ("." host-label){0,3} "." [a-z]{2,10}', ("host-label",)),
    "host-label": ("[a-z0-9] ([a-z0-9-]{0,30} [a-z0-9])?", ()),
    "email": ('[a-zA-Z0-9_+-]{1,32} ("." [a-zA-Z0-9_+-]{1,32}){0,3} "@" hostname', ("hostname",)),
    "uri": (
        '"http" "s"? "://" hostname (":" [1-9] [0-9]{0,3})? '
        '("/" [a-zA-Z0-9._~%!$&()*+,;=:@-]{0,32}){0,8} ("?" [a-zA-Z0-9._~%!$&()*+,;=:@/?-]{1,64})?',
        ("hostname",),
    ),
}
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


def ignored(keyword: str, where: str, why: str = "not enforced by the grammar") -> None:
    log.debug(
        "format: JSON Schema %s at %s is %s; the output is validated after", keyword, where, why
    )


# -- grammar text ------------------------------------------------------------------------------
# what a GBNF literal writes escaped: quote, backslash, controls and DEL
_LITERAL_ESCAPES = {
    **{cp: f"\\x{cp:02X}" for cp in (*range(0x20), 0x7F)},
    ord('"'): '\\"',
    ord("\\"): "\\\\",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def literal(text: str) -> str:
    """A GBNF string literal matching ``text`` exactly (one ``translate``:
    enums put thousands of these in a grammar)."""
    return '"' + text.translate(_LITERAL_ESCAPES) + '"'


def json_literal(value: Any) -> str:
    """A GBNF literal for ``value`` as compact JSON (``json.dumps`` escapes controls)."""
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _class_char(cp: int) -> str:
    if chr(cp) in "\\]-^[":
        return "\\" + chr(cp)
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    if cp > 0x7E:
        return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"
    return chr(cp)


def char_class(ranges: Iterable[tuple[int, int]], negated: bool = False) -> str:
    parts = [
        _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in ranges
    ]
    return "[" + ("^" if negated else "") + "".join(parts) + "]"


def group(expr: str) -> str:
    """``expr`` as one primary, for a repetition or a sequence."""
    simple = re.fullmatch(r'[\w-]+|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', expr)
    return expr if simple else f"({expr})"


def alternatives(options: Iterable[str]) -> str:
    unique = list(dict.fromkeys(options))
    return unique[0] if len(unique) == 1 else "(" + " | ".join(unique) + ")"


def repeat(expr: str, low: int, high: int | None) -> str:
    if high is not None and high == low:
        return "" if low == 0 else (expr if low == 1 else f"{group(expr)}{{{low}}}")
    if (low, high) == (0, 1):
        return f"{group(expr)}?"
    if high is None:
        return (
            f"{group(expr)}*"
            if low == 0
            else (f"{group(expr)}+" if low == 1 else f"{group(expr)}{{{low},}}")
        )
    return f"{group(expr)}{{{low},{high}}}"


def seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


# -- enum values as a prefix tree ------------------------------------------------------------
_Node = tuple[int, int, int]  # texts[lo:hi], all sharing their first ``depth`` characters


def enum_expr(values: Iterable[Any]) -> str | None:
    """One expression matching exactly the compact JSON texts of ``values``
    (as ``json_literal`` writes them), as a prefix tree: values that share a
    prefix share its states, so the grammar sampler follows one stack
    through it rather than one per value. None for no values.

    Edges are whole runs of characters (a radix tree). The tree is read off
    the sorted texts: a node is a run of them sharing a prefix, its children
    found by bisection and their common prefixes by comparing slices,
    so the work is per node, not per character; and the text is built
    without recursion, so any nesting is safe."""
    texts = sorted({json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values})
    if not texts:
        return None
    exprs: dict[_Node, str] = {}
    root: _Node = (0, len(texts), 0)
    stack: list[tuple[_Node, list[tuple[str, _Node]] | None]] = [(root, None)]
    while stack:
        node, edges = stack.pop()
        if edges is None:
            edges = _edges(texts, node)
            stack.append((node, edges))
            stack.extend((child, None) for _, child in edges)
            continue
        options = [seq(literal(label), exprs[child]) for label, child in edges]
        lo, _, depth = node
        if not options:
            exprs[node] = ""
        elif len(texts[lo]) == depth:  # a value ends here and others go on (1 and 12)
            exprs[node] = f"({' | '.join(options)})?"
        else:
            exprs[node] = options[0] if len(options) == 1 else f"({' | '.join(options)})"
    return exprs[root]


def _common(a: str, b: str, known: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, at least ``known``:
    by bisection on slices (compared in C), not character by character."""
    low, high = known, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _edges(texts: list[str], node: _Node) -> list[tuple[str, _Node]]:
    """The runs of characters from ``node`` to each of its children."""
    lo, hi, depth = node
    out = []
    i = lo + 1 if len(texts[lo]) == depth else lo  # the value that ends here sorts first
    while i < hi:
        ch = texts[i][depth]
        j = (
            hi
            if ord(ch) == 0x10FFFF
            else bisect_left(texts, texts[i][:depth] + chr(ord(ch) + 1), i, hi)
        )
        common = _common(texts[i], texts[j - 1], depth + 1)
        out.append((texts[i][depth:common], (i, j, common)))
        i = j
    return out


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


# -- what a grammar may spell out -------------------------------------------------------------
class GrammarTooLarge(ValueError):
    """A schema whose grammar would go over a ``GrammarBudget``: ``limit`` (its
    value the one applied) and what the grammar reached (``got``, or None when
    counting stopped there)."""

    def __init__(self, limit: Limit, got: int | None) -> None:
        self.limit, self.got = limit, got
        super().__init__(str(limit.exceeded("the schema's grammar", got)))


@dataclass
class GrammarBudget:
    """What the grammars built with it may spell out, all together (one
    budget for one grammar: a schema's, or every tool's of a request). The
    counts are of the grammar as built, so a ``$ref`` or a merge that repeats
    a part counts it again."""

    max_repeat: int = SCHEMA_REPEAT_CAP  # a count above this is left open
    repeats: int = SCHEMA_REPEATS.value
    alternatives: int = SCHEMA_ALTERNATIVES.value
    visits: int = SCHEMA_NODES.value  # schemas converted, merged ones again
    spent: dict[str, int] = field(default_factory=dict)

    def capped(self, low: int, high: int | None) -> tuple[int, int | None]:
        """``{low,high}`` as the grammar spells it: above ``max_repeat`` open."""
        if high is not None and high > self.max_repeat:
            high = None
        return min(low, self.max_repeat), high

    def spend(self, limit: Limit, allowed: int, count: int) -> None:
        got = self.spent.get(limit.key, 0) + count
        self.spent[limit.key] = got
        if got > allowed:
            raise GrammarTooLarge(replace(limit, value=allowed), got)

    def repeat(self, low: int, high: int | None) -> None:
        self.spend(SCHEMA_REPEATS, self.repeats, high if high is not None else low)


# -- integers and numbers by their digits -----------------------------------------------------
def _digit_class(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _any_digits(n: int) -> str:
    return repeat("[0-9]", n, n)


def _at_least(digits: str) -> str:
    """Strings of ``len(digits)`` digits, >= ``digits``."""
    if not digits or set(digits) == {"0"}:
        return _any_digits(len(digits))
    first, rest = int(digits[0]), digits[1:]
    options = [seq(f'"{first}"', _at_least(rest))]
    if first < 9:
        options.append(seq(_digit_class(first + 1, 9), _any_digits(len(rest))))
    return alternatives(options)


def _at_most(digits: str) -> str:
    """Strings of ``len(digits)`` digits, <= ``digits``."""
    if not digits or set(digits) == {"9"}:
        return _any_digits(len(digits))
    first, rest = int(digits[0]), digits[1:]
    options = []
    if first > 0:
        options.append(seq(_digit_class(0, first - 1), _any_digits(len(rest))))
    options.append(seq(f'"{first}"', _at_most(rest)))
    return alternatives(options)


def _between_same_length(low: str, high: str) -> str:
    if not low:
        return ""
    a, b = int(low[0]), int(high[0])
    if a == b:
        return seq(f'"{a}"', _between_same_length(low[1:], high[1:]))
    if set(low[1:]) <= {"0"} and set(high[1:]) <= {"9"}:
        return seq(_digit_class(a, b), _any_digits(len(low) - 1))
    options = [seq(f'"{a}"', _at_least(low[1:]))]
    if b - a >= 2:
        options.append(seq(_digit_class(a + 1, b - 1), _any_digits(len(low) - 1)))
    options.append(seq(f'"{b}"', _at_most(high[1:])))
    return alternatives(options)


def natural_range(low: int, high: int | None) -> str:
    """Non-negative integers in [low, high] (high None: up to ``MAX_DIGITS``
    digits, or one more than ``low`` has), as JSON writes them."""
    lo = str(low)
    if high is None:
        longest = max(MAX_DIGITS, len(lo) + 1)
        return alternatives(
            [
                _between_same_length(lo, "9" * len(lo)),
                seq("[1-9]", repeat("[0-9]", len(lo), longest - 1)),
            ]
        )
    hi = str(high)
    if len(lo) == len(hi):
        return _between_same_length(lo, hi)
    options = [_between_same_length(lo, "9" * len(lo))]
    if len(hi) - len(lo) >= 2:
        options.append(seq("[1-9]", repeat("[0-9]", len(lo), len(hi) - 2)))
    options.append(_between_same_length("1" + "0" * (len(hi) - 1), hi))
    return alternatives(options)


def integer_range(low: int | None, high: int | None) -> str:
    """Integers in [low, high], either end open (None); low <= high."""
    options = []
    if high is None or high >= 0:
        options.append(natural_range(max(low, 0) if low is not None else 0, high))
    if low is None or low < 0:
        top = -1 if high is None else min(high, -1)
        options.append(seq('"-"', natural_range(-top, None if low is None else -low)))
    return alternatives(options)


@dataclass(frozen=True)
class Bound:
    value: Decimal
    strict: bool


def _split(value: Decimal) -> tuple[int, str]:
    """The integer part and the fraction's digits (no trailing zeros) of ``value`` >= 0."""
    whole = int(value)
    text = format(value - whole, "f")
    frac = text.partition(".")[2].rstrip("0")
    return whole, frac


@dataclass(frozen=True)
class Fraction:
    """Digit strings after the ".": ``digits`` matches the non-empty ones
    (None: none), ``empty`` says whether no fraction at all is in."""

    digits: str | None
    empty: bool


_ANY_REST = f"[0-9]{{0,{MAX_FRACTION - 1}}}"
_ANY_FRACTION = Fraction(f"[0-9]{{1,{MAX_FRACTION}}}", True)
_NONZERO = Fraction(f'"0"{{0,{MAX_FRACTION - 1}}} [1-9] [0-9]{{0,{MAX_FRACTION - 1}}}', False)


def _after(first: str, rest: Fraction) -> str | None:
    """``first`` followed by ``rest`` (which may be empty)."""
    if rest.digits is None:
        return first if rest.empty else None
    return seq(first, f"({rest.digits})?" if rest.empty else group(rest.digits))


def _fraction(options: list[str | None], empty: bool) -> Fraction:
    kept = [o for o in options if o is not None]
    return Fraction(alternatives(kept) if kept else None, empty)


def fraction_at_least(digits: str, strict: bool) -> Fraction:
    """0.f >= 0.digits (> if strict); ``digits`` without trailing zeros."""
    if not digits:
        return _NONZERO if strict else _ANY_FRACTION
    first = int(digits[0])
    options = [_after(f'"{first}"', fraction_at_least(digits[1:], strict))]
    if first < 9:
        options.append(seq(_digit_class(first + 1, 9), _ANY_REST))
    return _fraction(options, False)


def fraction_at_most(digits: str, strict: bool) -> Fraction:
    """0.f <= 0.digits (< if strict)."""
    if not digits:
        return Fraction(None, False) if strict else Fraction(f'"0"{{1,{MAX_FRACTION}}}', True)
    first = int(digits[0])
    options = []
    if first > 0:
        options.append(seq(_digit_class(0, first - 1), _ANY_REST))
    options.append(_after(f'"{first}"', fraction_at_most(digits[1:], strict)))
    return _fraction(options, True)


def fraction_between(low: str, low_strict: bool, high: str, high_strict: bool) -> Fraction:
    """0.low <= 0.f <= 0.high (each end strict or not); 0.low < 0.high."""
    if not low and not low_strict:
        return fraction_at_most(high, high_strict)
    b = int(high[0])
    if not low:  # 0 < f
        if b == 0:
            return _fraction(
                [_after('"0"', fraction_between("", True, high[1:], high_strict))], False
            )
        options = [_after('"0"', _NONZERO)]
        if b >= 2:
            options.append(seq(_digit_class(1, b - 1), _ANY_REST))
        options.append(_after(f'"{b}"', fraction_at_most(high[1:], high_strict)))
        return _fraction(options, False)
    a = int(low[0])
    if a == b:
        return _fraction(
            [_after(f'"{a}"', fraction_between(low[1:], low_strict, high[1:], high_strict))], False
        )
    options = [_after(f'"{a}"', fraction_at_least(low[1:], low_strict))]
    if b - a >= 2:
        options.append(seq(_digit_class(a + 1, b - 1), _ANY_REST))
    options.append(_after(f'"{b}"', fraction_at_most(high[1:], high_strict)))
    return _fraction(options, False)


def _with_fraction(whole: str, frac: Fraction) -> str | None:
    if frac.digits is None:
        return whole if frac.empty else None
    tail = seq('"."', group(frac.digits))
    return seq(whole, f"({tail})?" if frac.empty else tail)


def magnitude_range(low: Bound, high: Bound | None) -> str | None:
    """Decimals without an exponent in the range (low.value >= 0, low < high)."""
    li, lf = _split(low.value)
    options: list[str | None] = []
    if high is None:
        options.append(_with_fraction(f'"{li}"', fraction_at_least(lf, low.strict)))
        options.append(_with_fraction(group(natural_range(li + 1, None)), _ANY_FRACTION))
    else:
        hi, hf = _split(high.value)
        if li == hi:
            options.append(
                _with_fraction(f'"{li}"', fraction_between(lf, low.strict, hf, high.strict))
            )
        else:
            options.append(_with_fraction(f'"{li}"', fraction_at_least(lf, low.strict)))
            if hi - li >= 2:
                options.append(_with_fraction(group(natural_range(li + 1, hi - 1)), _ANY_FRACTION))
            options.append(_with_fraction(f'"{hi}"', fraction_at_most(hf, high.strict)))
    kept = [o for o in options if o is not None]
    return alternatives(kept) if kept else None


def number_range(low: Bound | None, high: Bound | None) -> str | None:
    """Numbers in the range, written without an exponent; None if it is empty."""
    if _empty(low, high):
        return None
    zero = Decimal(0)
    options: list[str | None] = []
    if high is None or high.value > zero or (high.value == zero and not high.strict):
        start = Bound(zero, False) if low is None or low.value < zero else low
        options.append(magnitude_range(start, high))
    if low is None or low.value < zero:
        top = None if low is None else Bound(-low.value, low.strict)
        bottom = (
            Bound(zero, True)
            if high is None or high.value >= zero
            else Bound(-high.value, high.strict)
        )
        if (inner := magnitude_range(bottom, top)) is not None:
            options.append(seq('"-"', group(inner)))
    kept = [o for o in options if o is not None]
    return alternatives(kept) if kept else None


def _decimal(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def bounds(schema: dict[str, Any]) -> tuple[Bound | None, Bound | None]:
    """The tightest lower and upper bound, from both drafts' exclusive forms."""

    def tighter(a: Bound | None, b: Bound | None, lower: bool) -> Bound | None:
        if a is None or b is None:
            return a or b
        if a.value != b.value:
            return a if (a.value > b.value) == lower else b
        return a if a.strict else b

    low = high = None
    for key, lower in (("minimum", True), ("maximum", False)):
        value = _decimal(schema.get(key))
        if value is not None:
            strict = schema.get("exclusive" + key.capitalize()) is True  # draft 4
            bound = Bound(value, strict)
            low, high = (
                (tighter(low, bound, True), high) if lower else (low, tighter(high, bound, False))
            )
    for key, lower in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        value = _decimal(schema.get(key))
        if value is not None:
            bound = Bound(value, True)
            low, high = (
                (tighter(low, bound, True), high) if lower else (low, tighter(high, bound, False))
            )
    return low, high


def coarse(bound: Bound | None, lower: bool) -> Bound | None:
    """``bound`` with at most ``MAX_BOUND_DIGITS`` digits after the point,
    rounded outwards; None (no bound) from 10**MAX_BOUND_DIGITS on. Keeps the
    digit rules (one per digit) small."""
    if bound is None or abs(bound.value) >= Decimal(10) ** MAX_BOUND_DIGITS:
        return None
    with localcontext(prec=3 * MAX_BOUND_DIGITS):
        step = Decimal(1).scaleb(-MAX_BOUND_DIGITS)
        rounded = bound.value.quantize(step, rounding=ROUND_FLOOR if lower else ROUND_CEILING)
    return bound if rounded == bound.value else Bound(rounded, False)


def _empty(low: Bound | None, high: Bound | None) -> bool:
    if low is None or high is None:
        return False
    return low.value > high.value or (low.value == high.value and (low.strict or high.strict))


def integer_bounds(low: Bound | None, high: Bound | None) -> tuple[int | None, int | None]:
    """The inclusive integer range the bounds leave."""
    lo = hi = None
    if low is not None:
        whole = int(low.value.to_integral_value(rounding="ROUND_FLOOR"))
        lo = whole + 1 if (low.strict or whole < low.value) else whole
    if high is not None:
        whole = int(high.value.to_integral_value(rounding="ROUND_CEILING"))
        hi = whole - 1 if (high.strict or whole > high.value) else whole
    return lo, hi


# -- regular expressions (``pattern``) --------------------------------------------------------
class UnsupportedPattern(Exception):
    """A construct no grammar can express (lookaround, a backreference, ...)."""


MAX_CODEPOINT = 0x10FFFF
_JSON_SPECIAL = {0x22, 0x5C, *range(0x20)}  # what a JSON string writes escaped
_CLASS_ESCAPES = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "s": [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x2028, 0x2029), (0xFEFF, 0xFEFF)],
}
_CHAR_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "0": 0}


def _normalise(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], 0
    for lo, hi in _normalise(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODEPOINT:
        out.append((start, MAX_CODEPOINT))
    return out


def json_chars(ranges: list[tuple[int, int]]) -> str | None:
    """One character of a JSON string, as written, from the code points in
    ``ranges``: quote, backslash and controls as their escapes, surrogates left
    out. None if nothing is left."""
    ranges = _normalise(ranges)
    plain: list[tuple[int, int]] = []
    special: list[int] = []
    for lo, hi in ranges:
        special.extend(cp for cp in _JSON_SPECIAL if lo <= cp <= hi)
        cut = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)]
        plain.extend(_subtract((lo, hi), cut))
    options = []
    if plain:
        # a class that only leaves out what JSON escapes reads better negated
        outside = _complement(plain)
        negated = sum(hi - lo for lo, hi in outside) < sum(hi - lo for lo, hi in plain)
        options.append(char_class(outside, True) if negated else char_class(plain))
    options.extend(literal(json.dumps(chr(cp))[1:-1]) for cp in sorted(special))
    return alternatives(options) if options else None


def _subtract(span: tuple[int, int], cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    pieces = [span]
    for clo, chi in cuts:
        pieces = [
            p
            for lo, hi in pieces
            for p in ((lo, min(hi, clo - 1)), (max(lo, chi + 1), hi))
            if p[0] <= p[1]
        ]
    return pieces


@dataclass
class _Regex:
    """A recursive-descent reader of a ``pattern`` into a GBNF expression for
    the characters between a JSON string's quotes."""

    text: str
    pos: int = 0
    budget: GrammarBudget = field(default_factory=GrammarBudget)

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def take(self) -> str:
        if self.pos >= len(self.text):
            raise UnsupportedPattern("unexpected end")
        ch = self.text[self.pos]
        self.pos += 1
        return ch

    def parse(self) -> str:
        start_anchored = self.peek() == "^"
        if start_anchored:
            self.pos += 1
        body = self.alternation(top=True)
        end_anchored = self.peek() == "$"
        if end_anchored:
            self.pos += 1
        if self.pos != len(self.text):
            raise UnsupportedPattern(f"{self.peek()!r} at {self.pos}")
        return seq("" if start_anchored else "char*", body, "" if end_anchored else "char*")

    def alternation(self, top: bool = False) -> str:
        options = [self.sequence(top)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence(top))
        nonempty = [o for o in options if o]
        if len(nonempty) < len(options):
            return f"({alternatives(nonempty)})?" if nonempty else ""
        return alternatives(options)

    def sequence(self, top: bool) -> str:
        parts = []
        while self.pos < len(self.text) and self.peek() not in "|)":
            if self.peek() == "$" and top and self.pos == len(self.text) - 1:
                break
            atom = self.atom()
            parts.append(self.quantified(atom))
        return seq(*parts)

    def quantified(self, atom: str) -> str:
        while True:
            ch = self.peek()
            if ch in ("*", "+", "?"):
                self.pos += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
            elif ch == "{" and (m := re.compile(r"\{(\d+)(,(\d*))?\}").match(self.text, self.pos)):
                self.pos = m.end()
                low = int(m[1])
                high = low if m[2] is None else (int(m[3]) if m[3] else None)
                if high is not None and high < low:
                    raise UnsupportedPattern("a repeat with max below min")
            else:
                return atom
            if self.peek() in ("?", "+"):  # lazy or possessive: the same strings
                self.pos += 1
            low, high = self.budget.capped(low, high)
            self.budget.repeat(low, high)
            atom = repeat(atom, low, high) if atom else ""

    def atom(self) -> str:
        ch = self.take()
        if ch == "(":
            if self.peek() == "?":
                self.pos += 1
                kind = self.take()
                if kind == ":":
                    pass
                elif (kind == "P" and self.peek() == "<") or (
                    kind == "<" and self.peek() not in "=!"
                ):
                    if kind == "P":
                        self.pos += 1
                    end = self.text.find(">", self.pos)
                    if end < 0:
                        raise UnsupportedPattern("unclosed group name")
                    self.pos = end + 1
                else:
                    raise UnsupportedPattern(f"(?{kind}")
            inner = self.alternation()
            if self.take() != ")":
                raise UnsupportedPattern("unclosed group")
            return group(inner) if inner else ""
        if ch == "[":
            return self.charset(self.char_class())
        if ch == ".":
            return self.charset([(0, 9), (11, MAX_CODEPOINT)])
        if ch == "\\":
            return self.charset(self.escape(in_class=False))
        if ch in "*+?":
            raise UnsupportedPattern(f"nothing to repeat at {self.pos - 1}")
        if ch in "^$":
            raise UnsupportedPattern(f"an anchor inside the pattern at {self.pos - 1}")
        return self.charset([(ord(ch), ord(ch))])

    @staticmethod
    def charset(ranges: list[tuple[int, int]]) -> str:
        expr = json_chars(ranges)
        if expr is None:
            raise UnsupportedPattern("a class no JSON string character matches")
        return expr

    def escape(self, in_class: bool) -> list[tuple[int, int]]:
        ch = self.take()
        if ch.lower() in _CLASS_ESCAPES:
            ranges = _CLASS_ESCAPES[ch.lower()]
            return _complement(ranges) if ch.isupper() else list(ranges)
        if ch in _CHAR_ESCAPES and not (ch == "0" and self.peek().isdigit()):
            cp = _CHAR_ESCAPES[ch]
            return [(cp, cp)]
        if ch == "b" and in_class:
            return [(8, 8)]
        if ch in "xu":
            size = 2 if ch == "x" else 4
            digits = self.text[self.pos : self.pos + size]
            if len(digits) != size or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise UnsupportedPattern(f"\\{ch} without {size} hex digits")
            self.pos += size
            cp = int(digits, 16)
            return [(cp, cp)]
        if ch.isalnum():  # \b \B \1 \p{..} \cX \k<..>: no grammar for them
            raise UnsupportedPattern(f"\\{ch}")
        return [(ord(ch), ord(ch))]

    def char_class(self) -> list[tuple[int, int]]:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.pos >= len(self.text):
                raise UnsupportedPattern("unclosed [")
            if self.peek() == "]" and not first:
                self.pos += 1
                break
            first = False
            low = self.class_item()
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.class_item()
                if (
                    len(low) != 1
                    or len(high) != 1
                    or low[0][0] != low[0][1]
                    or high[0][0] != high[0][1]
                ):
                    raise UnsupportedPattern("a range between classes")
                if high[0][0] < low[0][0]:
                    raise UnsupportedPattern("a reversed range")
                ranges.append((low[0][0], high[0][0]))
            else:
                ranges.extend(low)
        return _complement(ranges) if negated else _normalise(ranges)

    def class_item(self) -> list[tuple[int, int]]:
        ch = self.take()
        if ch == "\\":
            return self.escape(in_class=True)
        if ch == "[" and self.peek() in (":", "=", "."):
            raise UnsupportedPattern("POSIX classes")
        return [(ord(ch), ord(ch))]


def pattern_expr(pattern: str, budget: GrammarBudget | None = None) -> str:
    """The characters between the quotes of a JSON string matching ``pattern``
    (searched, as JSON Schema does: an end without ``^``/``$`` is open); its
    repeat counts capped and spent from ``budget``."""
    return _Regex(pattern, budget=budget or GrammarBudget()).parse()


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
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-").lower() or "r"
        if base in PRIMITIVES or base == "root":
            base += "-x"
        name, n = base, 1
        while name in self.rules:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = ""  # reserved
        return name

    # - dispatch -
    def visit(self, schema: Any, where: str, hint: str) -> str:
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
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                self.budget.spend(SCHEMA_ALTERNATIVES, self.budget.alternatives, len(schema[key]))
                subs = [_merge(base, alt) if isinstance(alt, dict) else alt for alt in schema[key]]
                each = [enum_values(sub) if isinstance(sub, dict) else None for sub in subs]
                if all(v is not None for v in each):  # one of several consts: one tree
                    return self.enum([v for vs in each for v in vs or ()], where, hint)
                options = [
                    self.visit(sub, f"{where}.{key}[{i}]", f"{hint}-{i}")
                    for i, sub in enumerate(subs)
                ]
                return self.rule(hint, alternatives(options))
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
            value = self.visit(sub, f"{where}.properties.{name}", f"{hint}-{name}")
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
            other = alternatives([char_class(_normalise(cut), True), _ESCAPE])
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
        expr = None if _empty(low, high) else number_range(low, high)
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
