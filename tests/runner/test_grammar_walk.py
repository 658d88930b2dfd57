"""The walk's resample against the full pass on a toy vocabulary: a native
chain (top-k, top-p, temperature, draw) from the same seed picks the same
token from the walked set as from every candidate with the refused ones at
-inf, draw after draw, so the distributions are the same, not just close."""

from __future__ import annotations

import collections
import ctypes

import llama_cpp
import numpy as np
import pytest
from sampler_options import NEUTRAL

from jupyter_llm.runner import grammar_walk
from jupyter_llm.runner.sequence import build_chain

N_VOCAB = 3000
DEFAULTS = NEUTRAL


def full_pick(chain, logits: np.ndarray, allowed: np.ndarray) -> int:
    data = np.zeros(len(logits), dtype=grammar_walk.TOKEN_DATA)
    data["id"] = np.arange(len(logits))
    data["logit"] = np.where(allowed, logits, -np.inf)
    array = llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
        size=len(logits),
        selected=-1,
        sorted=False,
    )
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
    return int(array.data[array.selected].id)


def walked_pick(chain, need: int, logits: np.ndarray, allowed: np.ndarray) -> int:
    found = grammar_walk.walk(logits, need, lambda ids: allowed[ids])
    gave_up = found is None  # past MAX_WALK checks: the best of every allowed token
    if found is None:
        found = grammar_walk.best_of(np.flatnonzero(allowed), logits, need)
    picked = grammar_walk.pick_among(chain, 0, found, logits)
    assert picked is not None
    return -1 - picked if gave_up else picked


@pytest.mark.parametrize(
    "opts",
    [
        {"temperature": 0.0, "top_k": 40, "seed": 1},
        {"temperature": 0.8, "top_k": 40, "seed": 11},
        {"temperature": 1.5, "top_k": 5, "seed": 12, "top_p": 0.9},
        {"temperature": 1.0, "top_k": 20, "seed": 13, "min_p": 0.05},
    ],
)
def test_walked_draws_are_the_full_passs_draws(opts, monkeypatch):
    monkeypatch.setattr(grammar_walk, "WALK_FROM_VOCAB", N_VOCAB)
    opts = {**DEFAULTS, **opts}
    need = grammar_walk.walk_need(opts, N_VOCAB)
    assert need >= 1
    rng = np.random.default_rng(opts["seed"])
    full_chain = build_chain(N_VOCAB, 512, opts)
    walk_chain = build_chain(N_VOCAB, 512, opts)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    try:
        for step in range(300):
            logits = rng.normal(0, 3, N_VOCAB).astype(np.float32)
            allowed = rng.random(N_VOCAB) < (0.002 if step % 3 == 0 else 0.3)  # often few allowed
            allowed[rng.integers(N_VOCAB)] = True
            full = full_pick(full_chain, logits, allowed)
            walked = walked_pick(walk_chain, need, logits, allowed)
            if walked < 0:
                walked = -1 - walked
                counts["gave up"][walked] += 1
            assert walked == full, step
            assert allowed[walked]
            counts["full"][full] += 1
            counts["walk"][walked] += 1
    finally:
        llama_cpp.llama_sampler_free(full_chain)
        llama_cpp.llama_sampler_free(walk_chain)
    assert counts["full"] == counts["walk"]
    assert counts["gave up"].total() < 300 // 2  # most resamples were walks
    assert counts["gave up"] or need == 1  # top-k: few allowed, the best of all of them


def test_greedy_walk_takes_the_best_allowed_lowest_id_first():
    logits = np.array([1.0, 5.0, 5.0, 4.0, 5.0, -np.inf], dtype=np.float32)
    assert grammar_walk.walk(logits, 1, lambda ids: np.isin(ids, (2, 4))) == [2]
    assert grammar_walk.walk(logits, 2, lambda ids: np.isin(ids, (0, 3))) == [3, 0]
    assert grammar_walk.walk(logits, 3, lambda ids: ids == 0) == [0]  # all there are
    assert grammar_walk.walk(logits, 1, lambda ids: ids < 0) == []
    everything = np.arange(len(logits))
    assert grammar_walk.best_of(everything, logits, 3) == [1, 2, 4]  # -inf never
    assert grammar_walk.best_of(np.array([5, 0, 3]), logits, 8) == [3, 0]


def test_the_walk_checks_chunks_of_ranks_each_larger(monkeypatch):
    monkeypatch.setattr(grammar_walk, "FIRST_CHUNK", 4)
    monkeypatch.setattr(grammar_walk, "MAX_WALK", 50)
    logits = -np.arange(100, dtype=np.float32)  # rank = id
    chunks: list[list[int]] = []

    def allowed(ids):
        chunks.append(ids.tolist())
        return ids == 30

    assert grammar_walk.walk(logits, 1, allowed) == [30]
    assert chunks == [list(range(0, 4)), list(range(4, 20)), list(range(20, 50))]
    chunks.clear()
    assert grammar_walk.walk(logits, 1, allowed, early=True) is None  # none in 20
    assert chunks == [list(range(0, 4)), list(range(4, 20))]  # judged from the second chunk
    assert grammar_walk.walk(logits, 2, lambda ids: ids % 4 == 0, early=True) == [0, 4]
    assert grammar_walk.walk(logits, 3, lambda ids: ids % 40 == 0, early=True) is None


def test_an_early_walk_is_not_judged_by_the_refused_best_ranks(monkeypatch):
    """The best ranks are what the grammar just refused (a closing quote where
    the string must go on): none allowed there, most below. The walk goes on
    and finds them, where judging by the first chunk sent it to a pass over
    every token."""
    monkeypatch.setattr(grammar_walk, "FIRST_CHUNK", 4)
    monkeypatch.setattr(grammar_walk, "MAX_WALK", 50)
    logits = -np.arange(100, dtype=np.float32)  # rank = id
    assert grammar_walk.walk(logits, 3, lambda ids: ids >= 6, early=True) == [6, 7, 8]


def test_a_walk_goes_as_deep_as_its_limit(monkeypatch):
    """A grammar allowing 1 rank in 7: 8 are not within MAX_WALK (50) ranks;
    a deeper ``limit`` (the caller's, where the trie's pass would cost too
    much: ``DEEP_WALK``) finds them in rank order, the same as a walk whose
    bound never cut it."""
    monkeypatch.setattr(grammar_walk, "FIRST_CHUNK", 4)
    monkeypatch.setattr(grammar_walk, "MAX_WALK", 50)
    logits = -np.arange(300, dtype=np.float32)  # rank = id
    chunks: list[list[int]] = []

    def sparse(ids):  # 6, 13, 20...: none in the first chunk
        chunks.append(ids.tolist())
        return ids % 7 == 6

    assert grammar_walk.walk(logits, 8, sparse) is None  # 7 in MAX_WALK ranks
    assert grammar_walk.walk(logits, 8, sparse, early=True) is None
    chunks.clear()
    assert grammar_walk.walk(logits, 8, sparse, limit=100) == list(range(6, 62, 7))
    assert chunks == [list(range(0, 16)), list(range(16, 80))]
    assert grammar_walk.walk(logits, 8, sparse, limit=1000) == list(range(6, 62, 7))


def test_best_of_equals_a_sort_of_every_allowed_token():
    rng = np.random.default_rng(5)
    for _ in range(200):
        logits = rng.integers(-4, 4, 3000).astype(np.float32)  # many ties
        logits[rng.random(3000) < 0.05] = -np.inf
        allowed = np.flatnonzero(rng.random(3000) < rng.random())
        need = int(rng.integers(1, 60))
        finite = allowed[np.isfinite(logits[allowed])]
        expected = sorted(finite.tolist(), key=lambda t: (-logits[t], t))[:need]
        assert grammar_walk.best_of(allowed, logits, need) == expected


def test_a_walk_past_its_bound_gives_the_full_pass_the_job(monkeypatch):
    monkeypatch.setattr(grammar_walk, "MAX_WALK", 8)
    logits = np.arange(100, dtype=np.float32)
    assert grammar_walk.walk(logits, 1, lambda ids: ids == 0) is None
    assert grammar_walk.walk(logits, 1, lambda ids: ids == 95) == [95]


def test_need_follows_the_chain():
    big, small = grammar_walk.WALK_FROM_VOCAB, grammar_walk.WALK_FROM_VOCAB - 1
    assert grammar_walk.walk_need({**DEFAULTS, "temperature": 0, "top_k": 40}, small) == 0
    assert grammar_walk.walk_need({**DEFAULTS, "temperature": 0, "top_k": 0}, big) == 1
    assert grammar_walk.walk_need({**DEFAULTS, "temperature": 0.7, "top_k": 40}, big) == 40
    assert grammar_walk.walk_need({**DEFAULTS, "temperature": 0.7, "top_k": 0}, big) == 0
    assert (
        grammar_walk.walk_need({**DEFAULTS, "temperature": 0.7, "top_k": 40, "mirostat": 2}, big)
        == 0
    )
