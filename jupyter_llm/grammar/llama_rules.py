"""Would llama.cpp's grammar parser take this GBNF? Its one check that a
budget adding repeat counts cannot see: the rules a repetition spells out.

llama.cpp rewrites ``S{m,n}`` into ``n - m`` helper rules, and refuses a
repetition whose count times the rules its repeated item made (a group's
rules, helpers and the names first seen inside it) passes 2,000. A pattern
``^([a-z]{1,20} ){1,100}$`` is 21 rules times 100: refused, once the runner
had loaded the model, as a failed request. Read the same way here, it is
refused with the request. Pure text in, the reason out; only what decides
the count is parsed (llama-grammar.cpp ``parse_sequence``).
"""

from __future__ import annotations

import re

MAX_REPETITION = 2000  # llama-grammar.cpp MAX_REPETITION_THRESHOLD
_NAME = re.compile(r"[A-Za-z0-9-]+")
_INT = re.compile(r"[0-9]+")


class _Refused(Exception):
    pass


def repetition_refusal(grammar: str) -> str | None:
    """Why llama.cpp's parser would refuse ``grammar`` on its rule count,
    or None. Text it cannot read is left to llama.cpp (None)."""
    try:
        _Reader(grammar).rules()
    except _Refused as e:
        return str(e)
    except (IndexError, ValueError, RecursionError):  # left to llama.cpp's own parse
        return None
    return None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0
        self.names: set[str] = set()
        self.symbols = 0  # llama.cpp's symbol_ids: names and generated rules

    def name(self) -> None:
        m = _NAME.match(self.text, self.pos)
        if m is None:
            raise ValueError("a name")
        self.pos = m.end()
        if m[0] not in self.names:
            self.names.add(m[0])
            self.symbols += 1

    def space(self, newlines: bool) -> None:
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch in " \t" or (newlines and ch in "\r\n"):
                self.pos += 1
            elif ch == "#":
                while self.pos < len(text) and text[self.pos] not in "\r\n":
                    self.pos += 1
            else:
                return

    def rules(self) -> None:
        self.space(True)
        while self.pos < len(self.text):
            self.name()
            self.space(False)
            if not self.text.startswith("::=", self.pos):
                raise ValueError("::=")
            self.pos += 3
            self.space(True)
            self.alternates(nested=False)
            self.space(True)

    def alternates(self, nested: bool) -> None:
        self.sequence(nested)
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            self.space(True)
            self.sequence(nested)

    def skip_to(self, end: str) -> None:
        """Past a literal's or a class's closing ``end``, escapes skipped."""
        text = self.text
        while text[self.pos] != end:
            self.pos += 2 if text[self.pos] == "\\" else 1
        self.pos += 1

    def sequence(self, nested: bool) -> None:
        text = self.text
        made = 1  # llama.cpp's n_prev_rules: rules the last item made
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == '"' or ch == "[":
                self.pos += 1
                self.skip_to('"' if ch == '"' else "]")
                made = 1
            elif ch == "<" or ch == "!":
                self.pos = text.index(">", self.pos) + 1
                made = 1
            elif ch == ".":
                self.pos += 1
                made = 1
            elif _NAME.match(ch):
                self.name()
                made = 1
            elif ch == "(":
                self.pos += 1
                self.space(True)
                before = self.symbols
                self.symbols += 1  # the group's own rule
                self.alternates(nested=True)
                made = max(1, self.symbols - before)
                if text[self.pos] != ")":
                    raise ValueError(")")
                self.pos += 1
            elif ch in "*+?":
                self.pos += 1
                self.space(nested)
                made = self.repeat(made, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[ch])
                continue
            elif ch == "{":
                self.pos += 1
                self.space(nested)
                made = self.repeat(made, *self.counts(nested))
                continue
            else:
                return
            self.space(nested)

    def counts(self, nested: bool) -> tuple[int, int | None]:
        low = self.integer(nested)
        high: int | None = low
        if self.text[self.pos] == ",":
            self.pos += 1
            self.space(nested)
            high = self.integer(nested) if self.text[self.pos].isdigit() else None
        if self.text[self.pos] != "}":
            raise ValueError("}")
        self.pos += 1
        self.space(nested)
        if low > MAX_REPETITION:
            raise _Refused(f"a repeat of {low:,} times (llama.cpp takes {MAX_REPETITION:,})")
        if high is not None and high > MAX_REPETITION:
            high = None  # llama.cpp leaves such a count open
        return low, high

    def integer(self, nested: bool) -> int:
        m = _INT.match(self.text, self.pos)
        if m is None:
            raise ValueError("an integer")
        self.pos = m.end()
        self.space(nested)
        return int(m[0])

    def repeat(self, made: int, low: int, high: int | None) -> int:
        """llama.cpp's handle_repetitions: the check, then its helper rules."""
        total = high if high is not None and high > 0 else (low if low > 0 else 1)
        if made * total > MAX_REPETITION:
            raise _Refused(
                f"a repeat of {total:,} over an item of {made:,} rules spells out "
                f"{made * total:,} (llama.cpp takes {MAX_REPETITION:,}): repeats "
                "nested in repeats multiply"
            )
        self.symbols += 1 if high is None else high - low
        return made * total
