"""The embedding share of the runner's loop (``runner.embedding``) as pure
policy: chunks of whole inputs, the token bound checked while tokenizing,
chunk sizes from measured costs, and credit that keeps the embeddings to
their share of the loop beside streams. Times here are simulated."""

from __future__ import annotations

import itertools
import json

import pytest

from jupyter_llm.request.limits import EMBED_CHUNK_TOKENS, EMBED_TOKENS
from jupyter_llm.runner.embedding import (
    EMBED_SHARE,
    MIN_CHUNK_TOKENS,
    EmbedContextSize,
    EmbedJob,
    FairShare,
    context_failure,
    embed_context_size,
    vector_text,
)
from jupyter_llm.runner.protocol import EngineError, InputError


def job(texts: list[str]) -> EmbedJob:
    return EmbedJob(
        rid=1,
        texts=texts,
        truncate=True,
        dimensions=None,
        normalize=True,
        encoding="float",
        emit=lambda vectors: None,
        finish=lambda count: None,
        fail=lambda error: None,
    )


@pytest.mark.parametrize(
    ("sizes", "budget", "max_inputs", "taken"),
    [
        ([10, 10, 10], 25, 64, 2),
        ([10, 10, 10], 30, 64, 3),
        ([100, 1], 25, 64, 1),  # one input over the budget still goes, alone
        ([1] * 100, 512, 64, 64),  # at most one sequence per input of the context
        ([5, 5], 1, 64, 1),
    ],
)
def test_a_chunk_takes_whole_inputs_within_its_budget(sizes, budget, max_inputs, taken):
    j = job(["x"] * len(sizes))
    for n in sizes:
        j.add_tokens([7] * n)
    assert j.next_chunk(budget, max_inputs) == taken


def test_the_token_bound_holds_at_its_value_and_refuses_one_more():
    j = job(["x", "y", "z"])
    j.add_tokens([1] * (EMBED_TOKENS.value - 10))
    j.add_tokens([1] * 10)  # exactly the bound: fine
    with pytest.raises(InputError, match="embed_tokens") as info:
        j.add_tokens([1])
    assert "input has 300,001 tokens" in str(info.value)


def test_the_token_bound_names_how_far_tokenizing_got():
    j = job(["x"] * 5)
    with pytest.raises(InputError, match=r"its first 1 of 5 inputs\) has 300,001 tokens"):
        j.add_tokens([1] * (EMBED_TOKENS.value + 1))


def test_vectors_are_written_as_the_response_holds_them():
    assert vector_text([0.5, -1.25], "float") == "[0.5,-1.25]"
    assert json.loads(vector_text([0.1, 1e-300], "float")) == [0.1, 1e-300]  # exact repr
    assert vector_text([1.0], "base64") == '"AACAPw=="'  # little-endian float32, as OpenAI


def test_with_nothing_to_share_with_a_chunk_is_full_size():
    share = FairShare()
    assert share.may_run(completions=False)
    assert share.chunk_tokens() == EMBED_CHUNK_TOKENS


def test_a_chunk_aims_at_one_step_within_its_floor_and_ceiling():
    share = FairShare()
    share.stepped(0.010)
    assert share.chunk_tokens() == MIN_CHUNK_TOKENS  # no cost measured yet
    share.ran(0.0016, 64, completions=False)  # 25 us a token: 400 fit a step
    assert share.chunk_tokens() == 128  # grows at most twofold a chunk
    share.ran(0.0032, 128, completions=False)
    share.ran(0.0064, 256, completions=False)
    assert share.chunk_tokens() == 400
    share.ran(0.5, 400, completions=False)  # a slow chunk: the average follows
    assert share.chunk_tokens() == MIN_CHUNK_TOKENS  # never below the floor


def simulate(step: float, chunk: float, steps: int) -> tuple[float, float, int]:
    """A loop of ``steps`` decode steps of ``step`` seconds, an embedding
    turn of ``chunk`` seconds (64 tokens) wherever the share allows, the
    embedding having run alone before: time spent stepping, embedding, and
    the longest run of steps between turns."""
    share = FairShare()
    share.stepped(step)  # streams ran earlier...
    share.ran(chunk, 64, completions=False)  # ...and the embedding alone since
    stepped = embedded = 0.0
    turns_at = []
    for i in range(steps):
        share.stepped(step)
        stepped += step
        if share.may_run(completions=True):
            share.ran(chunk, 64, completions=True)
            embedded += chunk
            turns_at.append(i)
    gaps = [b - a for a, b in itertools.pairwise(turns_at)] or [steps]
    return stepped, embedded, max(gaps)


@pytest.mark.parametrize(
    ("step", "chunk"),
    [
        (0.0003, 0.003),  # a chunk costs ten steps (the demo model's floor)
        (0.02, 0.005),  # a chunk fits in a step (a GPU)
        (0.1, 0.6),  # a big model on the CPU
    ],
)
def test_beside_streams_embeddings_take_at_most_their_share(step, chunk):
    stepped, embedded, _ = simulate(step, chunk, 10_000)
    assert embedded > 0
    assert embedded <= EMBED_SHARE * stepped + chunk  # the share, give or take one turn


def test_streams_are_not_followed_by_a_chunk_at_once():
    """Credit is earned before a turn: a stream of a few tokens that arrives
    beside an embedding whose chunk costs ten steps sees no chunk."""
    _, embedded, _ = simulate(0.0003, 0.003, steps=10)
    assert embedded == 0.0


def test_without_streams_there_is_no_debt_or_savings():
    share = FairShare()
    share.stepped(0.001)
    share.ran(1.0, 64, completions=True)  # a long turn: in debt to the streams
    assert not share.may_run(completions=True)
    assert share.may_run(completions=False)  # the streams are gone: debt forgiven
    assert share.credit == 0.0


# -- the embedding context's size: from the inputs, never from the chat context ------------
C = EMBED_CHUNK_TOKENS


@pytest.mark.parametrize(
    ("longest", "limit", "pieces", "held", "size"),
    [
        # two one-word inputs beside a chat at 32k cells: one chunk's size
        (1, 32768, True, 0, (C, C)),
        (1, 32768, False, 0, (C, C)),
        (C, 32768, False, 0, (C, C)),
        # a longer input: cells by powers of two; a batch of a chunk where
        # pieces are decoded one after another, else the whole input at once
        (C + 1, 32768, True, 0, (2 * C, C)),
        (C + 1, 32768, False, 0, (2 * C, 2 * C)),
        (3000, 32768, True, 0, (4096, C)),
        (3000, 32768, False, 0, (4096, 4096)),
        (32768, 32768, True, 0, (32768, C)),
        # never past the limit (the longest an input is kept), even rounded up
        (3000, 3000, False, 0, (3000, 3000)),
        (5000, 3000, True, 0, (3000, C)),
        (1, 128, False, 0, (128, 128)),  # a model trained on fewer tokens than a chunk
        (1, 128, True, 0, (128, 128)),
        # a context already made is kept while it holds the input
        (10, 32768, True, 4096, (4096, C)),
        (4096, 32768, False, 4096, (4096, 4096)),
        (4097, 32768, False, 4096, (8192, 8192)),
        (1, 2048, False, 4096, (C, C)),  # made under a larger limit: not kept
    ],
)
def test_the_embedding_context_is_sized_from_the_inputs(longest, limit, pieces, held, size):
    assert embed_context_size(longest, limit, pieces, held) == EmbedContextSize(*size)


@pytest.mark.parametrize(
    ("size", "longest", "limit", "pieces", "kind", "says"),
    [
        # the smallest context: the machine has no memory for any embedding
        ((C, C), 0, 32768, True, EngineError, "(512 tokens, 512 a batch)"),
        ((128, 128), 3, 128, False, EngineError, "out of memory?"),
        # a long input asked for more: a 400 that says what to do
        ((4096, 4096), 3000, 32768, False, InputError, "an input of 3000 tokens asked for it"),
        ((32768, C), 30000, 32768, True, InputError, "send shorter inputs"),
    ],
)
def test_a_context_that_cannot_be_made_is_a_clear_error(size, longest, limit, pieces, kind, says):
    error = context_failure(EmbedContextSize(*size), longest, limit, pieces)
    assert type(error) is kind and says in str(error)
    assert str(error).startswith("failed to create the embedding context")


def test_a_job_knows_its_longest_input():
    j = job(["a", "b", "c"])
    for tokens in ([1, 2], [1, 2, 3, 4], [1]):
        j.add_tokens(tokens)
    assert j.longest == 4
