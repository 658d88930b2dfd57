"""Sampling held to a grammar without ever letting llama.cpp's grammar throw.

llama.cpp's grammar sampler throws a C++ exception when it is made to accept
a token it does not allow (a lazy trigger completed by a token that runs on
past it: Gemma's ``></`` after ``<tool_call``). Through ctypes that exception
aborts the runner, and every stream on the model dies with it. So here no
token reaches the grammar unchecked:

- the request's chain (penalties, top-k..., the final pick) samples first;
  the one token picked is checked against the grammar and against UTF-8, and
  only when it is refused is the chain run again, over the best allowed
  candidates found by walking them in logit order (``grammar_walk``), or over
  every candidate the grammar allows (llama.cpp's common sampler does that;
  here found through the vocabulary's trie, ``grammar_trie``: the same set,
  checking only tokens whose prefix was allowed), so a schema costs one
  check per token, not a pass over the vocabulary;
- a lazy grammar's triggers are watched here, not in llama.cpp: when one
  fires, the text it is fed from is checked in a copy of the grammar first; a
  token whose text the grammar refuses is left out and the chain picks again;
- constrained output is real UTF-8 (``utf8``), so a string's length in code
  points is what a strict decoder reads back.

A token nothing allows ends that request alone with an ``EngineError``.
Runs in the runner process only.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

from jupyter_llm.runner import grammar_walk
from jupyter_llm.runner.grammar_trie import TokenTrie
from jupyter_llm.runner.protocol import EngineError
from jupyter_llm.runner.utf8 import BOUNDARY, Utf8State, advance

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
CHECK_SAMPLED_FIRST = True  # internal: False applies the grammar to every candidate (tests compare)
MAX_REFUSED_TRIGGERS = 16  # tokens left out in one step before the request fails
TRIE_BUDGET = 16384  # a trie pass checking more gives way to a walk of DEEP_WALK ranks
TRIGGER_LOOKBACK = 4096  # bytes of output a trigger pattern not anchored at both ends is sought in


@dataclass(frozen=True)
class Triggers:
    """What switches a lazy grammar on (as llama.cpp's lazy grammar sampler
    takes them): regular expressions matched against the output so far (the
    grammar is fed from the first group that matched, or from the match; one
    written ``^...$`` must match the whole output), and token ids (fed from
    the token on)."""

    patterns: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()


def compile_triggers(patterns: tuple[str, ...]) -> list[tuple[re.Pattern[bytes], bool]]:
    """Each pattern over the output's bytes, and whether it must match all of
    it. ``EngineError`` for a pattern that does not compile."""
    compiled = []
    for pattern in patterns:
        try:
            whole = pattern[:1] == "^" and pattern[-1:] == "$"
            compiled.append((re.compile(pattern.encode()), whole))
        except re.error as e:
            raise EngineError(f"invalid trigger pattern {pattern!r}: {e}") from None
    return compiled


def trigger_start(
    patterns: list[tuple[re.Pattern[bytes], bool]], output: bytes | bytearray, new: int
) -> int | None:
    """Where the grammar is fed from, if a pattern matches ``output`` (whose
    last ``new`` bytes just came): the first group that matched something,
    else the match. A pattern not anchored at both ends is sought only near
    the end, and one anchored at both ends only while the output is at most
    ``TRIGGER_LOOKBACK`` bytes (a call opening after 4 KiB of blanks is text:
    watching it cost 13 ms a token at 1 MB, 52 at 4 MB), so watching costs the
    same at any length of output."""
    for pattern, whole in patterns:
        if whole and len(output) > TRIGGER_LOOKBACK:
            continue
        base = 0 if whole else max(0, len(output) - new - TRIGGER_LOOKBACK)
        match = pattern.fullmatch(output) if whole else pattern.search(output, base)
        if match is None:
            continue
        for group in range(1, (match.lastindex or 0) + 1):
            if match.start(group) >= 0 and match.end(group) > match.start(group):
                return match.start(group)
        return match.start()
    return None


def token_piece(vocab: Any, token: int, special: bool, buf: Any) -> bytes:
    """A token's bytes, read into ``buf`` (a larger buffer where it is too
    small). One buffer per thread: llama.cpp writes into it."""
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]


@dataclass
class TokenTable:
    """What sampling under a grammar needs to know of the vocabulary: each
    token's text as the grammar sees it, as the output gets it, and the
    tokens whose output is not whole UTF-8 on its own (byte-fallback tokens,
    parts of characters; computed once, when first needed)."""

    vocab: Any
    n_vocab: int
    piece: Callable[[int, bool], bytes]  # (token, special) -> its bytes
    tokenize: Callable[[bytes], list[int]]  # plain text, no special tokens
    _partial: dict[int, bytes] | None = None
    _longest: int = 1  # characters of the longest token's text, markers' included
    _broken_at_boundary: np.ndarray | None = None
    _trie: TokenTrie | None = None
    _building: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self) -> threading.Thread:
        """Read the vocabulary in a thread (a 262k vocabulary takes about a
        second), so the first request that needs it does not stall every
        stream. Join it before the model is freed."""
        thread = threading.Thread(target=self._prepare, name="token-table", daemon=True)
        thread.start()
        return thread

    def _prepare(self) -> None:
        self.partial()

    def ready_trie(self) -> TokenTrie | None:
        """The trie if it is built (else None: not waited for). The first
        ask starts its build in a thread (about a second of a core for 262k
        tokens), so a model that never meets a grammar never pays it; until
        it is ready the full pass answers, with the same tokens."""
        if self._trie is None and self._building is None:
            self._building = threading.Thread(target=self.trie, name="token-trie", daemon=True)
            self._building.start()
        return self._trie

    def join(self) -> None:
        """Wait for the trie's build, which reads the vocabulary: before it is freed."""
        if self._building is not None:
            self._building.join()

    def trie(self) -> TokenTrie:
        """The vocabulary as a trie of texts (``grammar_trie``), built once."""
        with self._lock:
            if self._trie is None:
                buf = ctypes.create_string_buffer(256)  # its own: the loop's is in use
                pieces = [token_piece(self.vocab, t, True, buf) for t in range(self.n_vocab)]
                eog = {t for t in range(self.n_vocab) if self.is_eog(t)}
                self._trie = TokenTrie.build(pieces, eog)
            return self._trie

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def partial(self) -> dict[int, bytes]:
        """Tokens whose output bytes are not complete UTF-8 by themselves."""
        with self._lock:
            return self._read_partial()

    def _read_partial(self) -> dict[int, bytes]:
        if self._partial is None:
            found: dict[int, bytes] = {}
            buf = ctypes.create_string_buffer(256)  # its own: the loop's is in use
            longest = 1
            for token in range(self.n_vocab):
                data = token_piece(self.vocab, token, False, buf)
                # a control token writes nothing, but its marker is text in a prompt
                shown = data or token_piece(self.vocab, token, True, buf)
                longest = max(longest, len(shown))
                if not data.isascii():
                    try:
                        data.decode()
                    except UnicodeDecodeError:
                        found[token] = data
            self._partial, self._longest = found, longest
            self._broken_at_boundary = np.array(
                [t for t, data in found.items() if advance(BOUNDARY, data) is None], dtype=np.int32
            )
        return self._partial

    def longest(self) -> int:
        """The most characters one token's text holds (its bytes, at least as
        many): a text of ``n`` characters is at least ``n / longest`` tokens."""
        self.partial()
        return self._longest

    def broken_at_boundary(self) -> np.ndarray:
        """Tokens that cannot start UTF-8 text (a stray continuation byte...)."""
        self.partial()
        assert self._broken_at_boundary is not None
        return self._broken_at_boundary

    def continuing(self, state: Utf8State) -> np.ndarray:
        """The tokens that may follow text standing mid-character at ``state``."""
        ok = [t for t, data in self.partial().items() if advance(state, data) is not None]
        return np.array(ok, dtype=np.int32)


class Candidates:
    """Every token with its logit, as llama.cpp's samplers take them."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.data = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self.array = llama_cpp.llama_token_data_array()
        self.one = np.zeros(1, dtype=TOKEN_DATA)
        self.many = np.zeros(n_vocab, dtype=TOKEN_DATA)  # ``allows_many``'s, apart from ``data``
        self.many_array = llama_cpp.llama_token_data_array(
            data=self.many.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        )
        self.one_array = llama_cpp.llama_token_data_array(
            data=self.one.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
            size=1,
            selected=-1,
            sorted=False,
        )

    def logits(self, ctx: Any, index: int) -> np.ndarray:
        """llama.cpp's logits for output ``index``, in place (read only: they
        are the context's own, valid until its next decode)."""
        return np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(ctx, index), shape=(self.n_vocab,)
        )

    def fill(self, ctx: Any, index: int) -> None:
        self.data["id"] = self.ids
        self.data["logit"] = self.logits(ctx, index)
        self.data["p"] = 0.0
        self.array.data = self.data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        self.array.size = self.n_vocab
        self.array.selected = -1
        self.array.sorted = False

    def exclude(self, tokens: Any) -> None:
        self.data["logit"][tokens] = -np.inf

    def keep_only(self, tokens: np.ndarray) -> None:
        kept = self.data["logit"][tokens]
        self.data["logit"] = -np.inf
        self.data["logit"][tokens] = kept

    def apply(self, sampler: Any) -> None:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(self.array))

    def pick(self, chain: Any) -> int | None:
        """The chain's choice, or None when no candidate is left."""
        if not np.isfinite(self.data["logit"]).any():
            return None
        self.apply(chain)
        chosen = self.array.selected
        if not 0 <= chosen < self.array.size:
            return None
        entry = self.array.data[chosen]
        return int(entry.id) if np.isfinite(entry.logit) else None

    def allows(self, grammar: Any, token: int) -> bool:
        """Does ``grammar`` (in its present state) take ``token`` next?"""
        self.one["id"] = token
        self.one["logit"] = 0.0
        self.one_array.size, self.one_array.selected, self.one_array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(self.one_array))
        return bool(np.isfinite(self.one["logit"][0]))

    def allows_many(self, grammar: Any, tokens: np.ndarray) -> np.ndarray:
        """Which of ``tokens`` ``grammar`` takes next: one native call."""
        n = len(tokens)
        part = self.many[:n]
        part["id"] = tokens
        part["logit"] = 0.0
        self.many_array.size, self.many_array.selected, self.many_array.sorted = n, -1, False
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(self.many_array))
        return np.isfinite(part["logit"])


@dataclass
class GrammarSampler:
    """One request's sampling under a grammar (lazy with ``triggers``).
    Owns ``chain`` and ``grammar`` (native samplers) until ``free``.

    The chain picks from all candidates first and only that token is checked;
    on a refusal the candidates are walked in logit order until the ``need``
    best allowed ones are found and the chain picks among them (the full
    pass's token: ``grammar_walk``), else the grammar goes over every
    candidate and the chain picks again, as llama.cpp's common sampler does.
    Greedy, that is the full path's token (the best token, if allowed, is the best allowed one).
    Sampled, it is llama.cpp's distribution, not exactly the grammar-filtered
    one: an allowed token is taken with its unconstrained probability p, and
    the mass of refused tokens is spread over the allowed ones by the resample
    (p_allowed + P(refused) * p_allowed / P(allowed) = p_allowed / P(allowed)
    only for samplers whose pick does not depend on the other candidates:
    top-k/top-p/min-p truncation and mirostat's state see the full set on the
    first try, the filtered set on the resample). ``check_first`` False
    (``CHECK_SAMPLED_FIRST``, internal) always takes the full path."""

    table: TokenTable
    candidates: Candidates
    chain: Any  # the request's chain, without the grammar
    grammar: Any  # a native grammar sampler, fresh (lazy: the one copied at a trigger)
    triggers: Triggers | None = None
    preserve: frozenset[int] = frozenset()  # control tokens the output renders as text
    active: Any = None  # the grammar holding the output (lazy: once a trigger fired)
    utf8: Utf8State = BOUNDARY
    output: bytearray = field(default_factory=bytearray)  # while awaiting a trigger
    _patterns: list[tuple[re.Pattern[bytes], bool]] = field(default_factory=list)
    check_first: bool = field(default_factory=lambda: CHECK_SAMPLED_FIRST)
    need: int = 0  # allowed tokens that decide the chain's pick (``grammar_walk``); 0: full pass
    read: int = 0  # best logits that decide the first pick (``grammar_walk.pick_need``); 0: all
    by_text: bool = False  # the grammar matches texts only: its full pass may go by ``trie``
    _penalties: Any = None  # the chain's leading penalties sampler, if any

    def __post_init__(self) -> None:
        self._penalties = grammar_walk.penalties_first(self.chain)
        if self.triggers is None:
            self.active = self.grammar
        else:
            self._patterns = compile_triggers(self.triggers.patterns)

    def sample(self, ctx: Any, index: int) -> int:
        """The next token, accepted by the chain and any grammar holding."""
        if self.active is not None and not self.check_first:
            return self._take(self._constrained(ctx, index), checked=False)
        token = self._first_pick(ctx, index)
        if token is None:
            raise EngineError("the sampler left no token to choose")
        if self.active is None:
            token = self._watch(ctx, index, token)
            llama_cpp.llama_sampler_accept(self.chain, token)
            return token
        if self._allowed(token):
            return self._take(token, checked=True)
        walked = self._walked(ctx, index) if self.need else None
        if walked is None:
            walked = self._constrained(ctx, index)
        return self._take(walked, checked=False)

    def _first_pick(self, ctx: Any, index: int) -> int | None:
        """The chain's pick over every candidate. Greedy or top-k, with or
        without penalties that only lower logits: from the best ``read``
        read off llama.cpp's logits in place (``grammar_walk.first_pick``,
        the same token); else the chain over a filled candidate array."""
        if self.read:
            return grammar_walk.first_pick(
                self.chain, self.read, self.candidates.logits(ctx, index)
            )
        self.candidates.fill(ctx, index)
        return self.candidates.pick(self.chain)

    def _walked(self, ctx: Any, index: int) -> int | None:
        """The pick among the best allowed tokens, found by walking the
        candidates in logit order (``grammar_walk``: the full pass's token);
        None when the walk gives up and the full pass must run."""
        c = self.candidates
        penalties = self._penalties
        if penalties is None:
            logits = c.logits(ctx, index)  # read in place: no copy
        else:
            c.fill(ctx, index)
            c.apply(penalties)  # in place, logits in id order
            logits = c.data["logit"]
        early = self._trie() is not None  # a narrow grammar: straight to the trie's pass
        found = grammar_walk.walk(logits, self.need, self._allowed_many, early)
        if found is None and early:
            allowed = self._trie_allowed(TRIE_BUDGET)
            if allowed is None:  # it allows too much for the trie: deeper ranks decide
                deep = grammar_walk.DEEP_WALK
                found = grammar_walk.walk(logits, self.need, self._allowed_many, limit=deep)
                allowed = self._trie_allowed() if found is None else None
            if allowed is not None:
                found = grammar_walk.best_of(allowed, logits, self.need)
        if not found:
            return None
        return grammar_walk.pick_among(self.chain, int(penalties is not None), found, logits)

    def _take(self, token: int, checked: bool) -> int:
        """Accept ``token`` once in the grammar holding (checked first:
        llama.cpp's grammar throws on a refused one) and once in the chain."""
        if not checked and not self._allowed(token):  # picked outside what was kept
            raise EngineError("the grammar allows no token here")
        self.utf8 = self._utf8_after(token) or BOUNDARY
        llama_cpp.llama_sampler_accept(self.active, token)
        llama_cpp.llama_sampler_accept(self.chain, token)
        return token

    def _output_bytes(self, token: int) -> bytes:
        return self.table.piece(token, token in self.preserve)

    def _utf8_after(self, token: int) -> Utf8State | None:
        if self.table.is_eog(token):
            return self.utf8 if self.utf8 == BOUNDARY else None
        return advance(self.utf8, self._output_bytes(token))

    def _allowed(self, token: int) -> bool:
        return self._utf8_after(token) is not None and self.candidates.allows(self.active, token)

    def _allowed_many(self, tokens: np.ndarray) -> np.ndarray:
        """``_allowed`` for each of ``tokens``, the grammar in one native call."""
        return self.candidates.allows_many(self.active, tokens) & self._utf8_ok(tokens)

    def _utf8_ok(self, tokens: np.ndarray) -> np.ndarray:
        if self.utf8 == BOUNDARY:
            return ~np.isin(tokens, self.table.broken_at_boundary())
        return np.isin(tokens, self.table.continuing(self.utf8))

    def _trie(self) -> TokenTrie | None:
        """The vocabulary's trie where the full pass may go by it: a grammar
        of texts, a large vocabulary, the fast path (the slow one stays
        llama.cpp's own pass, for the tests to compare), once it is built
        (until then the full pass: the same tokens)."""
        big = self.table.n_vocab >= grammar_walk.WALK_FROM_VOCAB
        return self.table.ready_trie() if self.by_text and big and self.check_first else None

    def _trie_allowed(self, budget: int | None = None) -> np.ndarray | None:
        """Every token the grammar and UTF-8 allow (``grammar_trie``); None,
        with ``budget``, where the trie's pass would check more tokens (a
        narrow grammar's checks 400-3,500 of Gemma's; one allowing 70k of
        them, 138k)."""
        trie = self._trie()
        assert trie is not None
        check = lambda ids: self.candidates.allows_many(self.active, ids)  # noqa: E731
        allowed = trie.allowed(check, budget)
        return None if allowed is None else allowed[self._utf8_ok(allowed)]

    def _constrained(self, ctx: Any, index: int) -> int:
        """Pick again among only what the grammar and UTF-8 allow."""
        c = self.candidates
        c.fill(ctx, index)
        if self._trie() is not None:  # the same candidates as the grammar's pass over all
            allowed = self._trie_allowed()
            assert allowed is not None  # no budget
            c.keep_only(allowed)
            token = c.pick(self.chain)
            if token is None:
                raise EngineError("the grammar allows no token here")
            return token
        c.apply(self.active)
        if self.utf8 == BOUNDARY:
            c.exclude(self.table.broken_at_boundary())
        else:
            c.keep_only(self.table.continuing(self.utf8))
        token = c.pick(self.chain)
        if token is None:
            raise EngineError("the grammar allows no token here")
        return token

    def _watch(self, ctx: Any, index: int, token: int) -> int:
        """While the grammar waits for a trigger: a token that fires one is
        taken only if the grammar takes the text it is fed from (which then
        holds from the next token on); else it is left out and the chain
        picks again."""
        refused: list[int] = []
        while True:
            fired = self._fire(token)
            if fired is not False:
                if fired is not None:
                    self.active = fired
                    self.output.clear()
                return token
            refused.append(token)
            if len(refused) > MAX_REFUSED_TRIGGERS:
                raise EngineError(
                    "the model's output opened a tool call the grammar cannot hold "
                    f"({len(refused)} tokens refused in one step)"
                )
            self.candidates.fill(ctx, index)
            self.candidates.exclude(refused)
            picked = self.candidates.pick(self.chain)
            if picked is None:
                raise EngineError("the sampler left no token to choose")
            token = picked

    def _fire(self, token: int) -> Any:
        """None: ``token`` fires no trigger. False: it fires one but the grammar
        refuses the text. Else the grammar, fed up to and through ``token``.
        The output watched grows by ``token``'s text unless it is refused."""
        assert self.triggers is not None
        if self.table.is_eog(token):
            return None
        if token in self.triggers.tokens:
            return self._feed([token], b"")
        piece = self.table.piece(token, True)
        self.output += piece  # in place: no copy of the output per token
        start = trigger_start(self._patterns, self.output, len(piece))
        if start is None:
            return None
        text = bytes(self.output[start:])
        tokens = self.table.tokenize(text)
        fired = False  # text that cannot be fed as tokens counts as refused
        if b"".join(self.table.piece(t, True) for t in tokens) == text:
            fired = self._feed(tokens, text)
        if fired is False:
            del self.output[len(self.output) - len(piece) :]
        return fired

    def _feed(self, tokens: list[int], text: bytes) -> Any:
        grammar = llama_cpp.llama_sampler_clone(self.grammar)
        state = advance(BOUNDARY, text)
        ok = state is not None
        for t in tokens:
            if not ok:
                break
            ok = self.candidates.allows(grammar, t)
            if ok:
                llama_cpp.llama_sampler_accept(grammar, t)
        if not ok:
            llama_cpp.llama_sampler_free(grammar)
            return False
        self.utf8 = state or BOUNDARY
        return grammar

    def free(self) -> None:
        for sampler in {id(s): s for s in (self.chain, self.grammar, self.active) if s}.values():
            llama_cpp.llama_sampler_free(sampler)
        self.chain = self.grammar = self.active = None
