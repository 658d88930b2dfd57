"""GBNF, llama.cpp's grammar language, as text: literals, character classes,
repeats and alternatives, a list of JSON values as one prefix tree, and the
budget that bounds what a grammar may spell out (``GrammarBudget``, from
``jupyter_llm.request.limits``)."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_llm.request.limits import (
    SCHEMA_ALTERNATIVES,
    SCHEMA_NODES,
    SCHEMA_REPEAT_CAP,
    SCHEMA_REPEATS,
    Limit,
)

MAX_DIGITS = 16  # digits of an integer or of a run without bounds
MAX_FRACTION = 20  # digits after the point: any float's repr fits
MAX_EXPONENT_DIGITS = 3

# a JSON string's escape; it needs the primitive u-hex
STRING_ESCAPE = r'"\\" (["\\/bfnrt] | "u" u-hex)'
# the primitives every grammar may use, and the primitives each one uses
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": ('" "?', ()),
    # a "\u" escape never writes a lone surrogate (json.loads would give one):
    # a pair is one character, as Python counts it; or the character is raw UTF-8
    "char": (r'[^"\\\x00-\x1F] | ' + STRING_ESCAPE, ("u-hex",)),
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
