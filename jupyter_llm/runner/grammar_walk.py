"""Resampling under a grammar without a pass over the whole vocabulary.

When the chain's first pick is refused, the grammar used to be applied to
every candidate (262k for Gemma: ~55 ms). Here the candidates are walked in
logit order instead, in chunks of ranks each checked in one native call,
until ``need`` allowed tokens are found; the chain's samplers after its
penalties then pick among only those.

Why it is exact:

- Penalties change each token's logit on its own (a refused token stays at
  -inf), so applying them before the grammar or after it gives the same
  logits; the walk ranks tokens by their penalised logit.
- Greedy (``need`` 1): the full path's pick is the highest allowed logit,
  lowest id among equals (llama.cpp's greedy keeps the first maximum of an
  id-ordered array). Walking by logit descending, id ascending, the first
  allowed token met is that token: every token before it has a higher logit
  (or an equal one and a lower id) and was refused.
- Top-k (``need`` k): llama.cpp's top-k on the grammar-filtered candidates
  keeps the k highest allowed logits; the walk finds the same k (all allowed
  ones, if fewer exist: then it ran to the end or to -inf). Top-p, typical,
  min-p, temperature and the final draw come after top-k in the chain, so they
  see the same set with the same logits and, from the same random state,
  draw the same token. What may differ: the order of tokens with exactly
  equal logits, which top-k's partial sort leaves unspecified anyway.
- Without top-k (``need`` 0) or under mirostat, the chain's pick depends on
  every allowed token, so the caller keeps the full pass.

A walk that checks ``MAX_WALK`` tokens without finding ``need`` gives up
(None; sooner where the trie's pass is at hand: ``walk``): the caller then
takes the ``need`` best of every allowed token (``best_of``, the set found
by ``grammar_trie``: what the walk would have found had it gone on to the
end), or the full pass. Where the trie's pass
would check too many tokens (the grammar allows much, 70k of Gemma's tokens,
but not the model's best ranks: 7 of the first 400), it stops, and the walk
goes on to ``DEEP_WALK`` ranks instead (a few ms against 40-120 ms). Runs
in the runner process only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NamedTuple

import llama_cpp
import numpy as np

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
MAX_WALK = 2048  # tokens checked in rank order before the whole allowed set is sought
DEEP_WALK = 16384  # the walk's bound where the trie's pass would check too much
FIRST_CHUNK = 64  # the walk's first chunk of ranks (then 4x larger each)
WALK_FROM_VOCAB = 16384  # a smaller vocabulary's full pass costs less than the walk's checks
MAX_READ = 4096  # best logits a penalised chain's first pick may read; more: the full pass


def walk_need(opts: dict[str, Any], n_vocab: int) -> int:
    """How many allowed tokens decide the chain's pick for ``opts`` (as
    ``sequence.build_chain`` builds it): 1 greedy, top_k with top-k, else 0
    (every allowed token matters: the full pass). 0 for a small vocabulary,
    whose full pass in C is cheaper than checks one at a time from Python."""
    if n_vocab < WALK_FROM_VOCAB:
        return 0
    if float(opts["temperature"]) <= 0:
        return 1
    if int(opts["mirostat"]) in (1, 2):
        return 0
    return max(0, int(opts["top_k"]))


class Penalties(NamedTuple):
    """The penalty options as the chain applies them (``sequence.build_chain``)."""

    repeat: float
    freq: float
    presence: float
    window: int  # last tokens penalised (``repeat_last_n``, -1 read as the context)


def penalties(opts: dict[str, Any], n_ctx: int) -> Penalties | None:
    """The request's penalties, or None where they leave every logit as it
    is (no penalty sampler in the chain)."""
    repeat, freq, presence = (
        float(opts["repeat_penalty"]),
        float(opts["frequency_penalty"]),
        float(opts["presence_penalty"]),
    )
    if repeat == 1.0 and freq == 0.0 and presence == 0.0:
        return None
    window = int(opts["repeat_last_n"])
    return Penalties(repeat, freq, presence, n_ctx if window == -1 else window)


def pick_need(opts: dict[str, Any], n_vocab: int, n_ctx: int) -> int:
    """How many of the best logits, read before any penalty, decide the
    chain's pick over every token (``first_pick``): ``walk_need``'s, plus the
    penalty window where penalties lead the chain (``sequence.build_chain``).
    Penalties that only lower logits (``repeat_penalty`` at least 1,
    ``frequency_penalty`` and ``presence_penalty`` at least 0) lower at most
    one token per position of their window, so at least ``need`` of the best
    ``need + window`` keep their logits, at or above every token left out:
    the best ``need`` after the penalties are among them. 0 (the full pass):
    penalties that may raise a logit, or a window so long that reading that
    many logits costs more than the copy it saves (``MAX_READ``)."""
    need, penalised = walk_need(opts, n_vocab), penalties(opts, n_ctx)
    if not need or penalised is None:
        return need
    if penalised.repeat < 1.0 or penalised.freq < 0.0 or penalised.presence < 0.0:
        return 0
    read = need + max(0, penalised.window)
    return read if read <= MAX_READ else 0


def ranked(logits: np.ndarray, limit: int) -> tuple[np.ndarray, bool]:
    """Token ids by logit descending (lowest id first among equals), at
    least the best ``limit`` of them with every tie at the cut; and whether
    they are all the finite ones (the walk can then end without finding
    enough). Reads ``logits`` without copying them all (``best``)."""
    n = len(logits)
    idx = np.arange(n) if n <= limit else best(logits, limit)
    idx = idx[np.argsort(-logits[idx], kind="stable")]
    finite = idx[np.isfinite(logits[idx])]
    return finite, len(idx) == n or len(finite) < len(idx)


def best(logits: np.ndarray, limit: int) -> np.ndarray:
    """The ids of the ``limit`` highest logits and every one tied with the
    last (``limit`` < their number). The logits are dealt into ``blocks``
    strided blocks and only the blocks whose maximum reaches the ``limit``-th highest
    block maximum are read: at least ``limit`` logits reach it, so the best
    ``limit`` all lie in those blocks (and in the tail a whole block does not
    cover). A pass over the vocabulary in C, then a few thousand logits."""
    n = len(logits)
    size = max(1, min(64, n // (8 * limit)))
    blocks = n // size
    if blocks <= limit:
        cut = np.partition(logits, n - limit)[n - limit]
        return np.flatnonzero(logits >= cut)
    maxima = logits[: blocks * size].reshape(size, blocks).max(axis=0)  # block j: j, j + blocks...
    threshold = np.partition(maxima, blocks - limit)[blocks - limit]
    chosen = np.flatnonzero(maxima >= threshold)
    ids = (np.arange(size)[:, None] * blocks + chosen).ravel()
    ids = np.concatenate([ids, np.arange(blocks * size, n)])
    values = logits[ids]
    cut = np.partition(values, len(ids) - limit)[len(ids) - limit]
    return ids[values >= cut]


def first_pick(chain: Any, need: int, logits: np.ndarray) -> int | None:
    """The chain's pick over every token from the ``need`` best alone
    (``pick_need``: 1 greedy, the top-k, plus the penalty window where
    penalties lead the chain), read from ``logits`` in place: the same token
    as the chain over all of them (the module's reasons), without building a
    262k candidate array. The whole chain, penalties included, runs over
    them in id order, as over every token: greedy keeps the lowest id among
    equal logits either way."""
    if need == 1:  # greedy without penalties
        token = int(np.argmax(logits))  # the first maximum: greedy's pick
        return token if np.isfinite(logits[token]) else None
    order, _ = ranked(logits, need)  # with every tie at the cut
    if len(order) == 0:
        return None
    return pick_among(chain, 0, np.sort(order).tolist(), logits)


def walk(
    logits: np.ndarray,
    need: int,
    allowed: Callable[[np.ndarray], np.ndarray],
    early: bool = False,
    limit: int | None = None,
) -> list[int] | None:
    """The ``need`` best allowed tokens (fewer if no more exist), in rank
    order; None if ``limit`` (``MAX_WALK``) checks did not settle it. ``allowed`` takes
    token ids and says which are allowed (a chunk of ranks at a time, each
    chunk larger: one native call each, not one per token).

    ``early`` (the caller has the trie's pass to every allowed token, cheap
    where the grammar allows little: digits, punctuation): also None as soon
    as the share allowed in the last chunk would not find ``need`` within
    ``limit``, judged from the second chunk on: the best ranks are what the
    grammar just refused and its near kin (a string's closing quote in
    ``"``, ``",``, ``".``... where the schema wants more characters), so
    their share says little of the ranks below."""
    limit = MAX_WALK if limit is None else limit
    order, whole = ranked(logits, limit)
    settled = whole and len(order) <= limit
    order = order[:limit]
    found: list[int] = []
    start, size = 0, max(FIRST_CHUNK, 2 * need)
    while start < len(order):
        chunk = order[start : start + size]
        ok = allowed(chunk)
        found.extend(chunk[ok][: need - len(found)].tolist())
        if len(found) == need:
            return found
        past_first = start > 0
        start, size = start + len(chunk), size * 4
        ahead = np.count_nonzero(ok) / len(chunk) * (len(order) - start)  # at this share
        if early and not settled and past_first and len(found) + ahead < need:
            return None  # at this share, ``limit`` ranks hold fewer than ``need``
    return found if settled else None


def best_of(allowed: np.ndarray, logits: np.ndarray, need: int) -> list[int]:
    """The ``need`` best of every ``allowed`` token (all of them, if fewer)
    by logit descending, lowest id first among equals: ``walk``'s answer
    when it ran out of checks, from the whole allowed set (only the best
    and their ties sorted: a wide grammar allows most of 262k tokens)."""
    allowed = allowed[np.isfinite(logits[allowed])]
    if len(allowed) > need:  # the ``need`` best and their ties, before sorting
        values = logits[allowed]
        allowed = allowed[values >= np.partition(values, len(values) - need)[len(values) - need]]
    order = np.lexsort((allowed, -logits[allowed]))
    return allowed[order[:need]].tolist()


def pick_among(chain: Any, first: int, tokens: list[int], logits: np.ndarray) -> int | None:
    """The chain's samplers from index ``first`` on (after its penalties,
    already in ``logits``) applied to ``tokens`` alone: its pick, or None."""
    data = np.zeros(len(tokens), dtype=TOKEN_DATA)
    data["id"] = tokens
    data["logit"] = logits[tokens]
    array = llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
        size=len(tokens),
        selected=-1,
        sorted=False,
    )
    for i in range(first, llama_cpp.llama_sampler_chain_n(chain)):
        sampler = llama_cpp.llama_sampler_chain_get(chain, i)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    chosen = array.selected
    if not 0 <= chosen < array.size:
        return None
    entry = array.data[chosen]
    return int(entry.id) if np.isfinite(entry.logit) else None


def penalties_first(chain: Any) -> Any:
    """The chain's penalties sampler if it leads the chain (else None)."""
    if llama_cpp.llama_sampler_chain_n(chain) < 2:
        return None
    sampler = llama_cpp.llama_sampler_chain_get(chain, 0)
    name = llama_cpp.llama_sampler_name(sampler)
    return sampler if name == b"penalties" else None
