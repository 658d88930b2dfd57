"""Prompt lookup: draft the tokens that followed the place in a sequence's
own prompt or output whose context best matches how the output ends now.

Two rules over the previous lookup (the latest earlier occurrence of the
last 4, 3 or 2 tokens):

- **The longest match, not the latest.** The candidates are the earlier
  places where the last two tokens occurred; each is scored by how far
  back it goes on agreeing with the output's end, and the longest wins
  (the latest among equals). A text that repeats a phrase with two endings
  ("it is a computer that translates ...", "it is a computer that runs
  ...") is drafted from the ending its longer context picks, where the
  latest 4-gram picked wrong about every other time.
- **Learned substitutions.** An edit that renames (``orders`` to
  ``purchases``) breaks every draft copied across the old name. When the
  output leaves the copied text by putting one or two tokens in place of
  one and then rejoins it (the next token is the one after the replaced
  one), the replacement is learned, and later drafts copy it in the old
  token's place. A draft rejected at a learned replacement drops it; one
  accepted at it confirms it, and a confirmed one-for-one replacement
  counts as the old token when contexts are compared, so the line after
  a renamed name is found by its context again.

``benchmarks/prompt_lookup.py`` replays 26 recorded answers of Gemma 3 270M
(rewrites, renames, quotes, JSON, free text, greedy and sampled) through
the engine's drafting policy: tokens per step's time 1.61x -> 1.99x
(geometric mean); the quote 0.86x -> 2.10x and the rename rewrite 1.27x ->
1.67x as ``batch_invariant`` answers them; one sampled answer 1.00x ->
0.99x, none other lower.

Everything is bounded per sequence: the candidates compared
(``MAX_CANDIDATES``), how far back (``MAX_MATCH``), how far an edit may
reach (``REALIGN_WINDOW``), the substitutions kept (``MAX_SUBSTITUTIONS``).
A long prompt is indexed from its last ``DRAFT_LOOKUP`` tokens. Drafts
never hold an image's marks (negative ids). Runs in the runner process.
"""

from __future__ import annotations

from jupyter_llm.request.limits import DRAFT_LOOKUP
from jupyter_llm.runner.context_window import common_prefix

MAX_CANDIDATES = 16  # the latest earlier places of the last two tokens, scored
MAX_MATCH = 16  # tokens compared back from the end: a longer agreement scores the same
REALIGN_WINDOW = 8  # tokens an edit may span for the output to rejoin the copied text
MAX_SUBSTITUTIONS = 64  # learned replacements kept per sequence
MAX_REPLACEMENT = 4  # tokens that may replace one, where two tokens after them rejoin
WEAK_REPLACEMENT = 2  # ... where only one token after them does


class PromptLookup:
    """A sequence's lookup drafter, following its history as it grows.
    ``propose`` is called at each step the sequence may draft (its draft
    decoded or only judged in the shadow); it compares the tokens that came
    since with what the lookup expected, to learn and unlearn."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)
        self.places: dict[tuple[int, int], list[int]] = {}  # token pair -> positions after it
        self.indexed = max(1, len(self.tokens) - DRAFT_LOOKUP.value)
        self.source: int | None = None  # where the next token is expected to be copied from
        self.departed: tuple[int, int] | None = None  # (source, output) positions of an edit
        self.substitutions: dict[int, tuple[int, ...]] = {}
        self.confirmed: dict[int, int] = {}  # a confirmed one-for-one replacement -> the old token
        self.proposed_at = len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens to draft after the history (none where no
        earlier place matches its last two tokens)."""
        self._follow()
        if self.source is None:
            self._rejoin()
        h = self.tokens
        for j in range(self.indexed, len(h) - 1):  # the pair ending at j, followed by h[j + 1]
            self.places.setdefault((h[j - 1], h[j]), []).append(j + 1)
        self.indexed = max(self.indexed, len(h) - 1)
        best = self._longest_match()
        if best is not None:
            self.source, self.departed = best, None
        self.proposed_at = len(h)
        if self.source is None or k <= 0:
            return []
        return self._copy(self.source, k, len(h))[0]

    def _longest_match(self) -> int | None:
        """The position after the earlier place of the last two tokens
        whose context agrees longest with the history's end."""
        h, old = self.tokens, self.confirmed
        if len(h) < 2:
            return None
        a, b = h[-2], h[-1]
        pairs = {(a, b), (old.get(a, a), b), (a, old.get(b, b)), (old.get(a, a), old.get(b, b))}
        places = sorted({p for pair in pairs for p in self.places.get(pair, [])[-MAX_CANDIDATES:]})
        best, longest = None, 0
        for start in reversed(places[-MAX_CANDIDATES:]):
            n = 2
            while n < MAX_MATCH and start - 1 - n >= 0:
                was, now = h[start - 1 - n], h[-1 - n]
                if was != now and old.get(now) != was:
                    break
                n += 1
            if n > longest:
                best, longest = start, n
        return best

    def _copy(self, start: int, k: int, end: int) -> tuple[list[int], list[int], list[bool]]:
        """Up to ``k`` tokens copied from ``start`` (before ``end``), learned
        substitutions applied; with the source position after each and
        whether it is a substitution's."""
        h, out, after, substituted = self.tokens, [], [], []
        i = start
        while len(out) < k and i < end and h[i] >= 0:
            replacement = self.substitutions.get(h[i])
            tokens = replacement or (h[i],)
            out.extend(tokens)
            after.extend([i + 1] * len(tokens))
            substituted.extend([replacement is not None] * len(tokens))
            i += 1
        return out[:k], after[:k], substituted[:k]

    def _follow(self) -> None:
        """Compare the tokens since the last proposal with the copy the
        lookup expected: the copy goes on where they agree; where they
        depart, remember where (``_rejoin``). A substitution the output
        took is confirmed; one it did not take is dropped."""
        h = self.tokens
        came = h[self.proposed_at :]
        if not came or self.source is None:
            return
        expected, after, substituted = self._copy(self.source, len(came), self.proposed_at)
        m = common_prefix(expected, came)
        for i in range(m):
            replacement = self.substitutions.get(h[after[i] - 1], ())
            if substituted[i] and len(replacement) == 1:
                self.confirmed[replacement[0]] = h[after[i] - 1]
        if m == len(came):
            self.source = after[-1]
            return
        if m < len(substituted) and substituted[m]:
            replacement = self.substitutions.pop(h[after[m] - 1], ())
            if len(replacement) == 1:
                self.confirmed.pop(replacement[0], None)
        self.departed = (after[m - 1] if m else self.source, self.proposed_at + m)
        self.source = None

    def _rejoin(self) -> None:
        """After the output departed from the copied text at source ``d``:
        where its latest tokens match the text again within
        ``REALIGN_WINDOW``, and one token was replaced by at most
        ``MAX_REPLACEMENT`` (two tokens agreeing again, or one after a
        replacement), learn the replacement."""
        if self.departed is None:
            return
        h = self.tokens
        d, g = self.departed
        since = h[g:]
        if not since:
            return
        if len(since) > REALIGN_WINDOW:
            self.departed = None
            return
        for q in range(d + 1, min(d + REALIGN_WINDOW, g) + 1):
            t = 0  # tokens before q that the output's last tokens match
            while t < min(len(since), 4) and q - 1 - t >= d and h[q - 1 - t] == since[-1 - t]:
                t += 1
            replaced = q - t - d  # source tokens the output skipped
            replacement = tuple(since[: len(since) - t])
            if t >= 2 or (t == 1 and replaced == 1 and 0 < len(replacement) <= WEAK_REPLACEMENT):
                self.departed = None
                if replaced == 1 and 0 < len(replacement) <= MAX_REPLACEMENT and h[d] >= 0:
                    if h[d] in self.substitutions or len(self.substitutions) < MAX_SUBSTITUTIONS:
                        self.substitutions[h[d]] = replacement
                return
