"""The first pick under a grammar read off the logits in place
(``grammar_walk.first_pick``, ``best``) against the native chain over every
candidate: the same token, draw after draw from the same seed, and the same
best ids as a full sort, at vocabulary sizes the blocks do not divide, with
ties and -inf among them."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest
from sampler_options import NEUTRAL

from jupyter_llm.runner import grammar_walk
from jupyter_llm.runner.sequence import build_chain

OPTS = NEUTRAL


def chain_pick(chain, logits: np.ndarray) -> int:
    data = np.zeros(len(logits), dtype=grammar_walk.TOKEN_DATA)
    data["id"] = np.arange(len(logits))
    data["logit"] = logits
    array = llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
        size=len(logits),
        selected=-1,
        sorted=False,
    )
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
    return int(array.data[array.selected].id)


def expected_best(logits: np.ndarray, limit: int) -> set[int]:
    cut = np.sort(logits)[::-1][limit - 1]
    return set(np.flatnonzero(logits >= cut).tolist())


@pytest.mark.parametrize("n", [50, 3001, 65_537, 262_144 + 7])
@pytest.mark.parametrize("limit", [1, 40, 2048])
def test_best_is_a_full_sorts_best(n, limit):
    rng = np.random.default_rng(n + limit)
    for case in range(6):
        logits = rng.normal(0, 3, n).astype(np.float32)
        if case % 3 == 1:  # ties at the cut, some in the tail past the blocks
            logits[rng.integers(0, n, 60)] = np.float32(9.0)
            logits[-3:] = np.float32(9.0)
        if case % 3 == 2:  # most refused outright
            logits[rng.random(n) < 0.9] = -np.inf
        if limit >= n:
            continue
        got = grammar_walk.best(logits, limit)
        assert len(set(got.tolist())) == len(got)
        assert set(got.tolist()) == expected_best(logits, limit), case
        order, _ = grammar_walk.ranked(logits, limit)
        assert list(order[:1]) == [int(np.argmax(logits))]  # lowest id among equals
        assert (np.diff(logits[order]) <= 0).all()


@pytest.mark.parametrize(
    "opts",
    [
        {"temperature": 0.0, "top_k": 40, "seed": 1},
        {"temperature": 0.8, "top_k": 40, "seed": 11, "top_p": 0.9},
        {"temperature": 1.5, "top_k": 5, "seed": 12},
        {"temperature": 1.0, "top_k": 20, "seed": 13, "min_p": 0.05},
    ],
)
def test_first_pick_is_the_chains_pick_over_every_token(opts):
    n = 70_001  # the walk's vocabulary size and blocks that do not divide it
    opts = {**OPTS, **opts}
    need = grammar_walk.walk_need(opts, n)
    assert need >= 1
    rng = np.random.default_rng(opts["seed"])
    full_chain, fast_chain = build_chain(n, 512, opts), build_chain(n, 512, opts)
    picks = []
    try:
        for step in range(200):
            logits = rng.normal(0, rng.uniform(0.5, 5), n).astype(np.float32)
            if step % 4 == 0:
                logits[rng.random(n) < 0.5] = -np.inf
            full = chain_pick(full_chain, logits)
            fast = grammar_walk.first_pick(fast_chain, need, logits)
            assert fast == full, step
            picks.append(fast)
    finally:
        llama_cpp.llama_sampler_free(full_chain)
        llama_cpp.llama_sampler_free(fast_chain)
    assert len(set(picks)) > (1 if opts["temperature"] == 0 else 20)  # real draws, not one token


def test_first_pick_greedy_takes_the_lowest_id_of_the_best_and_none_when_all_refused():
    chain = build_chain(10, 64, {**OPTS, "temperature": 0.0, "top_k": 40, "seed": 1})
    try:
        logits = np.array([1, 7, 3, 7, 7, 0, 0, 0, 0, 0], dtype=np.float32)
        assert grammar_walk.first_pick(chain, 1, logits) == 1
        assert grammar_walk.first_pick(chain, 1, np.full(10, -np.inf, np.float32)) is None
    finally:
        llama_cpp.llama_sampler_free(chain)


@pytest.mark.parametrize(
    "opts",
    [
        {"temperature": 0.0, "top_k": 40, "seed": 1, "repeat_penalty": 1.1},
        {"temperature": 0.8, "top_k": 40, "seed": 2, "top_p": 0.9, "repeat_penalty": 1.1},
        {"temperature": 1.0, "top_k": 10, "seed": 3, "repeat_penalty": 1.5, "repeat_last_n": 16},
        {"temperature": 0.7, "top_k": 40, "seed": 4, "frequency_penalty": 0.8},
        {"temperature": 0.0, "top_k": 0, "seed": 5, "presence_penalty": 2.0, "repeat_last_n": 8},
    ],
)
def test_a_penalised_first_pick_is_the_chains_pick_over_every_token(opts):
    """Penalties that only lower logits: the pick from the best ``need +
    window`` is the chain's over every token, draw after draw. The logits
    favour what was just picked (as a model that repeats itself), so the
    penalties push the window's tokens below others every step."""
    n = 70_001
    opts = {**OPTS, **opts}
    need = grammar_walk.pick_need(opts, n, 512)
    window = opts["repeat_last_n"]
    assert need == grammar_walk.walk_need(opts, n) + window
    rng = np.random.default_rng(opts["seed"])
    full_chain, fast_chain = build_chain(n, 512, opts), build_chain(n, 512, opts)
    picks: list[int] = []
    penalised = 0
    try:
        for step in range(200):
            logits = rng.normal(0, rng.uniform(0.5, 3), n).astype(np.float32)
            recent = picks[-window:]
            # the window's tokens lead by a little: a penalty can tip them below others
            logits[recent] = logits.max() + rng.uniform(-0.3, 0.3, len(recent)).astype(np.float32)
            if step % 5 == 0:
                logits[rng.random(n) < 0.5] = -np.inf
            full = chain_pick(full_chain, logits)
            fast = grammar_walk.first_pick(fast_chain, need, logits)
            assert fast == full, step
            penalised += bool(recent) and full != int(np.argmax(logits))
            for chain in (full_chain, fast_chain):  # the window moves on in both
                llama_cpp.llama_sampler_accept(chain, full)
            picks.append(full)
    finally:
        llama_cpp.llama_sampler_free(full_chain)
        llama_cpp.llama_sampler_free(fast_chain)
    assert penalised > 20  # the penalties decided many picks: they were applied


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"temperature": 0.8, "top_k": 40}, 40),  # no penalties: the top-k
        ({"temperature": 0.0, "top_k": 40}, 1),  # greedy
        ({"temperature": 0.8, "top_k": 40, "repeat_penalty": 1.1}, 40 + 64),
        ({"temperature": 0.0, "repeat_penalty": 1.1}, 1 + 64),
        ({"temperature": 0.0, "repeat_penalty": 1.1, "repeat_last_n": 0}, 1),  # off
        ({"temperature": 0.8, "top_k": 40, "presence_penalty": 0.5, "repeat_last_n": -1}, 552),
        # 4,097 best logits: past MAX_READ, the full pass
        ({"temperature": 0.8, "top_k": 40, "repeat_penalty": 1.1, "repeat_last_n": 4057}, 0),
        ({"temperature": 0.8, "top_k": 40, "repeat_penalty": 1.1, "repeat_last_n": 4056}, 4096),
        ({"temperature": 0.8, "top_k": 40, "repeat_penalty": 0.9}, 0),  # raises logits
        ({"temperature": 0.8, "top_k": 40, "frequency_penalty": -0.5}, 0),  # raises logits
        ({"temperature": 0.8, "top_k": 0, "repeat_penalty": 1.1}, 0),  # every token matters
    ],
)
def test_pick_need_reads_the_penalty_window_or_the_full_pass(options, expected):
    assert grammar_walk.pick_need({**OPTS, **options}, 262_144, 512) == expected
