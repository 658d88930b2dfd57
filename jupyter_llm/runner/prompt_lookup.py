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
  output leaves the copied text by putting up to four tokens in place of
  one and then rejoins it (two tokens agree again after them, or one
  after at most two), the replacement is learned, and later copies put
  it in the old token's place. Where the output then does not take a
  replacement the copy offered, it is dropped; where it does, it is
  confirmed, and a confirmed one-for-one replacement counts as the old
  token when contexts are compared, so the line after a renamed name is
  found by its context again.
- **A copy that is being followed goes on** until the output leaves it
  or another place agrees with a longer context than it has.

``benchmarks/prompt_lookup.py`` replays 26 recorded answers of Gemma 3 270M
(rewrites, renames, quotes, JSON, free text, greedy and sampled) through
the engine's drafting policy: tokens per step's time 1.61x -> 1.99x
(geometric mean); the quote 0.86x -> 2.10x and the rename rewrite 1.27x ->
1.67x as ``batch_invariant`` answers them; two sampled answers 0.01
lower (1.00x -> 0.99x, 1.65x -> 1.64x), none other lower.

Everything is bounded per sequence: the places compared (``MAX_CANDIDATES``
of the pair and of its forms through confirmed replacements; each pair
keeps its latest places only), how far back (``MAX_MATCH``), how long an
edit is followed (``REALIGN_WINDOW``), the substitutions kept
(``MAX_SUBSTITUTIONS``).
A long prompt is indexed from its last ``DRAFT_LOOKUP`` tokens. Drafts
never hold an image's marks (negative ids). Runs in the runner process.
"""

from __future__ import annotations

from jupyter_llm.request.limits import DRAFT_LOOKUP
from jupyter_llm.runner.context_window import common_prefix

MAX_CANDIDATES = 16  # the latest earlier places of the last two tokens, scored
MAX_MATCH = 16  # tokens compared back from the end: a longer agreement scores the same
REALIGN_WINDOW = 8  # output tokens an edit is followed for, waiting for the text to return
MAX_SUBSTITUTIONS = 64  # learned replacements kept per sequence
MAX_REPLACEMENT = 4  # tokens that may replace one, where two tokens after them rejoin
WEAK_REPLACEMENT = 2  # ... where only one token after them does


Position = tuple[int, int]  # a history index, and how many tokens of its replacement are done


class PromptLookup:
    """A sequence's lookup drafter, following its history as it grows.
    ``propose`` is called at every step of the sequence (with ``k`` 0 where
    it does not draft); it first compares the tokens that came since the
    last call with the copy it expected, to learn and unlearn."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)
        self.places: dict[tuple[int, int], list[int]] = {}  # token pair -> positions after it
        self.indexed = max(1, len(self.tokens) - DRAFT_LOOKUP.value)
        self.source: Position | None = None  # where the next token is expected to be copied from
        self.agreed = 0  # tokens the copy from ``source`` has agreed with, context included
        self.departed: tuple[int, int] | None = None  # (source, output) indices of an edit
        self.substitutions: dict[int, tuple[int, ...]] = {}
        self.confirmed: dict[int, int] = {}  # a confirmed one-for-one replacement -> the old token
        self.proposed_at = len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens to draft after the history: copied on from
        where the output has been following a copy, or from the earlier
        place whose context agrees longer (none where nothing matches)."""
        self._follow()
        if self.source is None:
            self._rejoin()
        self._index()
        found = self._longest_match()
        if found is not None and (self.source is None or found[1] > self.agreed):
            self.source, self.agreed, self.departed = (found[0], 0), found[1], None
        self.proposed_at = len(self.tokens)
        if self.source is None or k <= 0:
            return []
        return self._copy(self.source, k, len(self.tokens))[0]

    def _index(self) -> None:
        """Add the pairs the history gained; a pair keeps its latest
        ``MAX_CANDIDATES`` places (at most twice that between trims)."""
        h = self.tokens
        for j in range(self.indexed, len(h) - 1):  # the pair ending at j, followed by h[j + 1]
            places = self.places.setdefault((h[j - 1], h[j]), [])
            places.append(j + 1)
            if len(places) > 2 * MAX_CANDIDATES:
                del places[:-MAX_CANDIDATES]
        self.indexed = max(self.indexed, len(h) - 1)

    def _longest_match(self) -> tuple[int, int] | None:
        """The position after the earlier place of the last two tokens
        whose context agrees longest with the history's end, and how many
        tokens agree (at most ``MAX_MATCH``)."""
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
        return None if best is None else (best, longest)

    def _copy(self, start: Position, k: int, end: int) -> tuple[list[int], list[Position]]:
        """Up to ``k`` tokens copied from ``start`` (history indices before
        ``end``), learned substitutions applied; with the position after
        each."""
        h, out, after = self.tokens, [], []
        i, done = start
        while len(out) < k and i < end and h[i] >= 0:
            tokens = self.substitutions.get(h[i]) or (h[i],)
            for j in range(done, len(tokens)):
                out.append(tokens[j])
                after.append((i, j + 1) if j + 1 < len(tokens) else (i + 1, 0))
            i, done = i + 1, 0
        return out[:k], after[:k]

    def _follow(self) -> None:
        """Compare the tokens since the last proposal with the copy the
        lookup expected: the copy goes on where they agree; where they
        depart, remember where (``_rejoin``). A substitution the output
        took is confirmed; one it did not take is dropped. A copy that ran
        out (the text's end, an image) just ends."""
        h = self.tokens
        came = h[self.proposed_at :]
        if not came or self.source is None:
            return
        expected, after = self._copy(self.source, len(came), self.proposed_at)
        m = common_prefix(expected, came)
        for n in range(m):
            text = h[after[n][0] - (after[n][1] == 0)]  # the text token this one stands for
            replacement = self.substitutions.get(text, ())
            if len(replacement) == 1:
                self.confirmed[replacement[0]] = text
        if m == len(came):
            self.source, self.agreed = after[-1], self.agreed + m
            return
        start, self.source = self.source, None
        if m == len(expected):
            return
        i, done = after[m - 1] if m else start  # where the token that differs came from
        if h[i] in self.substitutions:  # the output did not take this replacement
            self._forget(h[i])
        self.departed = (i, self.proposed_at + m - done)

    def _rejoin(self) -> None:
        """After the output departed from the copied text at index ``d``:
        where its latest tokens match the text again within
        ``REALIGN_WINDOW``, and they replaced one token (by up to
        ``MAX_REPLACEMENT`` tokens where two tokens agree again after
        them, ``WEAK_REPLACEMENT`` where one does), learn the replacement."""
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
            replaced = q - t - d  # text tokens the output left out or replaced
            replacement = tuple(since[: len(since) - t])
            if t >= 2 or (t == 1 and replaced == 1 and 0 < len(replacement) <= WEAK_REPLACEMENT):
                self.departed = None
                if replaced == 1 and 0 < len(replacement) <= MAX_REPLACEMENT and h[d] >= 0:
                    self._learn(h[d], replacement)
                return

    def _learn(self, token: int, replacement: tuple[int, ...]) -> None:
        if token in self.substitutions:
            self._forget(token)
        if len(self.substitutions) < MAX_SUBSTITUTIONS:
            self.substitutions[token] = replacement

    def _forget(self, token: int) -> None:
        replacement = self.substitutions.pop(token, ())
        if len(replacement) == 1 and self.confirmed.get(replacement[0]) == token:
            del self.confirmed[replacement[0]]
