"""A regular-expression subset (JSON Schema's ``pattern``) as the GBNF of the
characters between a JSON string's quotes: searched, as JSON Schema does;
no lookaround, backreferences or word boundaries (``UnsupportedPattern``);
repeat counts capped and spent from a ``GrammarBudget``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from jupyter_llm.grammar.gbnf import (
    GrammarBudget,
    alternatives,
    char_class,
    group,
    literal,
    repeat,
    seq,
)


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


def normalise_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], 0
    for lo, hi in normalise_ranges(ranges):
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
    ranges = normalise_ranges(ranges)
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
        return _complement(ranges) if negated else normalise_ranges(ranges)

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
