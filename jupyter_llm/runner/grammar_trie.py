"""Every token a grammar allows, found without applying it to the whole
vocabulary: the vocabulary as a trie of token texts, checked level by level.

llama.cpp's grammar matches a token's text code point by code point, so a
token it allows has every prefix allowed too: a token whose text is a proper
prefix of it (at a character boundary) consumes the same first code points
from the same stacks and ends there. So a token needs checking only when its
parent (the longest token whose text is such a prefix of its own) was
allowed. A pass checks the roots, then the children of the allowed ones, and
so on: one native call per level over a few thousand tokens where the
grammar allows little (digits, punctuation), instead of 262k. Where it allows
almost everything (inside a string) it checks about the whole vocabulary,
in a few calls, as a full pass does.

The same set as the full pass, exactly, under these conditions (else a token
is a root, checked every time):

- parent and child are valid UTF-8 without NUL bytes (llama.cpp's decoder
  stops at a NUL and has its own quirks with invalid or overlong bytes);
  a child of a clean parent is clean too, as its text starts with the parent's;
- a token with no such prefix token but a character of two bytes or more
  first has the byte token of its lead byte as parent: llama.cpp checks a
  token ending mid-character by whether the grammar allows any character
  those bits could complete to, so the byte is allowed wherever one of its
  characters is (not for the overlong leads 0xC0, 0xC1, nor past 0xF4);
- end-of-generation tokens are checked every time (allowed by the grammar's
  end, not their text);
- the grammar refers to no token by id (``<[id]>`` or ``<token>`` in GBNF:
  those match ids, not texts): ``matches_text`` says so, and a grammar that
  does is applied the old way.

If the grammar waits mid-character (a byte token was taken), a clean token
starts with a lead byte where a continuation byte is needed: refused, with
its prefix. Runs in the runner process only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LEADS = (0xC2, 0xF4)  # the lead bytes of valid UTF-8 of two bytes or more
Check = Callable[[np.ndarray], np.ndarray]  # token ids -> allowed (bool), in one native call


@dataclass(frozen=True)
class TokenTrie:
    roots: np.ndarray  # tokens checked on every pass
    offsets: np.ndarray  # token t's children: children[offsets[t]:offsets[t + 1]]
    children: np.ndarray
    eog: np.ndarray  # end-of-generation tokens, checked on every pass

    @classmethod
    def build(cls, pieces: list[bytes], eog: set[int]) -> TokenTrie:
        """The trie of ``pieces`` (each token's text as llama.cpp's grammar
        reads it: ``llama_token_to_piece`` with special tokens rendered)."""
        n = len(pieces)
        texts: list[str | None] = [None] * n
        by_text: dict[str, int] = {}
        for token, piece in enumerate(pieces):
            if token in eog or not piece or b"\0" in piece:
                continue
            try:
                text = piece.decode()
            except UnicodeDecodeError:
                continue
            texts[token] = text
            by_text.setdefault(text, token)
        lead = {  # byte tokens of lead bytes: parents of what starts with a character of theirs
            piece[0]: token
            for token, piece in enumerate(pieces)
            if len(piece) == 1 and LEADS[0] <= piece[0] <= LEADS[1] and token not in eog
        }
        parent = np.full(n, -1, dtype=np.int64)
        for token, text in enumerate(texts):
            if text is None:
                continue
            for end in range(len(text) - 1, 0, -1):
                found = by_text.get(text[:end])
                if found is not None:
                    parent[token] = found
                    break
            else:
                parent[token] = lead.get(pieces[token][0], -1)
        eogs = np.array(sorted(eog), dtype=np.int32)
        is_root = parent < 0
        is_root[eogs] = False
        has_parent = np.flatnonzero(~is_root & (parent >= 0))
        order = has_parent[np.argsort(parent[has_parent], kind="stable")]
        counts = np.bincount(parent[has_parent], minlength=n)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        return cls(np.flatnonzero(is_root).astype(np.int32), offsets, order.astype(np.int32), eogs)

    def children_of(self, tokens: np.ndarray) -> np.ndarray:
        starts = self.offsets[tokens]
        lengths = self.offsets[tokens + 1] - starts
        before = np.cumsum(lengths) - lengths  # where each token's run begins in the result
        index = np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))
        return self.children[index]

    def allowed(self, check: Check, budget: int | None = None) -> np.ndarray | None:
        """Every token ``check`` allows (ids, unordered): roots, then the
        children of allowed tokens, level by level. None, with ``budget``,
        where the pass would check more tokens than that: the grammar allows
        much here and the pass would cost about what one over the vocabulary
        does (a level is given up before it is checked)."""
        found = [self.eog[check(self.eog)]] if len(self.eog) else []
        frontier, checked = self.roots, len(self.eog)
        while len(frontier):
            checked += len(frontier)
            if budget is not None and checked > budget:
                return None
            ok = frontier[check(frontier)]
            found.append(ok)
            frontier = self.children_of(ok)
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int32)


def matches_text(grammar: str) -> bool:
    """Whether the GBNF ``grammar`` matches texts only (no token references:
    ``<...>`` and ``!<...>`` outside literals, classes and comments)."""
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
        elif c == "#":
            while i < n and grammar[i] != "\n":
                i += 1
        elif c in "<!":
            return False
        i += 1
    return True
