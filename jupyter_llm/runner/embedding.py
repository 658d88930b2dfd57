"""Embedding requests as jobs of the runner's loop, and the share of the loop they get.

An embed request is not run whole: the runner's loop advances it one turn at a
time between the decode steps of running completions, first tokenizing its
inputs (so the total is checked against ``EMBED_TOKENS`` before any
embedding work), then embedding a few whole inputs per turn in one batch.
``FairShare`` sizes the turns from measured times, so a stream beside an
embedding waits at most one short turn between two of its tokens and keeps
most of its speed, whatever the model and the machine. Pure policy and
bookkeeping: the llama.cpp calls are in ``embedding_context``.
"""

from __future__ import annotations

import base64
import json
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from jupyter_llm.request.limits import EMBED_CHUNK_TOKENS, EMBED_TOKENS
from jupyter_llm.runner.protocol import EngineError, InputError

# Time the embeddings may take from the loop while completions run, as a
# fraction of the time of their decode steps: 1/3 keeps a stream at 3/4 of its
# speed alone by the runner's own clock (1.33x its time per token). What the
# share does not see (the server's work, caches shared by the two contexts,
# a busy machine) comes on top: with 1/2, the demo model's streams measured
# 1.35-1.83x beside an embedding on a two-core machine, too near the issue's
# 2x; with 1/3, 1.18-1.55x. A large embedding still gets a quarter of the loop.
EMBED_SHARE = 1 / 3
# Inputs embedded together in one batch (the embedding context's sequences).
EMBED_SEQS = 64
SMOOTHING = 0.2  # weight of the newest measurement in the running averages
# The smallest chunk: below this a decode's fixed cost (building the graph,
# starting the threads or kernels) outweighs its tokens, and an embedding
# sized to a fast model's step would crawl (1-token chunks: 70x slower).
MIN_CHUNK_TOKENS = 64


@dataclass(eq=False)
class EmbedJob:
    """One embed request and how far it got."""

    rid: int
    texts: list[str]
    truncate: bool
    dimensions: int | None
    normalize: bool | None  # None: as the legacy route does for this model
    encoding: str  # "float": JSON arrays; "base64": little-endian float32, base64 (OpenAI)
    emit: Callable[[list[str]], None]  # vectors, each as the JSON text of one array element
    finish: Callable[[int], None]  # the tokens embedded
    fail: Callable[[Exception], None]
    cancelled: Callable[[], bool] = lambda: False
    tokens: list[array] = field(default_factory=list)  # each input's tokens, once tokenized
    counted: int = 0  # tokens of the inputs tokenized so far
    longest: int = 0  # tokens of the longest input tokenized so far
    embedded: int = 0  # inputs embedded (and emitted) so far
    fed: int = 0  # tokens of the next input already decoded, when it is split over chunks

    @property
    def tokenized(self) -> bool:
        return len(self.tokens) == len(self.texts)

    def add_tokens(self, tokens: list[int]) -> None:
        """Record the next input's tokens; over ``EMBED_TOKENS`` in all is an
        ``InputError`` at once, before any embedding work."""
        self.tokens.append(array("i", tokens))
        self.counted += len(tokens)
        self.longest = max(self.longest, len(tokens))
        if self.counted > EMBED_TOKENS.value:
            field = "input"
            if not self.tokenized:
                field = f"input (its first {len(self.tokens):,} of {len(self.texts):,} inputs)"
            raise InputError(str(EMBED_TOKENS.exceeded(field, self.counted)))

    def next_chunk(self, budget: int, max_inputs: int = EMBED_SEQS) -> int:
        """How many of the next inputs the next chunk takes: as many whole
        inputs as fit ``budget`` tokens (at least one) and ``max_inputs``."""
        start = self.embedded
        end, total = start, 0
        while end < len(self.tokens) and end - start < max_inputs:
            total += len(self.tokens[end])
            if total > budget and end > start:
                break
            end += 1
        return end - start


@dataclass(frozen=True)
class EmbedContextSize:
    """The embedding context's shape: ``n_ctx`` cells (its cache, the
    sequences of a chunk all together) and ``n_batch`` tokens a decode may
    take (its ubatch too: a pooled input is read in one)."""

    n_ctx: int
    n_batch: int


def embed_context_size(
    longest: int,
    limit: int,
    pieces: bool,
    held: int = 0,
    chunk: int = EMBED_CHUNK_TOKENS,
) -> EmbedContextSize:
    """The embedding context for inputs of up to ``longest`` tokens, sized
    from them and not from the chat context: made at a chat's 32k cells, with
    a ubatch as long, it asked llama.cpp for 34.5 GB on Gemma 3 270M, for two
    one-word inputs. A chunk of several inputs takes at most ``chunk``
    tokens, one input up to ``limit`` (the longest an input is kept: it is
    cut or refused there). The cells grow by powers of two from ``held`` (a
    context already made: kept while it suffices), so a run of ever longer
    inputs makes a context a few times at most. With ``pieces`` (last-token
    pooling under causal attention: a long input is decoded in pieces) a
    decode takes at most a chunk; otherwise a whole input."""
    limit = max(1, limit)
    need = min(max(longest, chunk, 1), limit)
    cells = held if need <= held <= limit else min(1 << (need - 1).bit_length(), limit)
    return EmbedContextSize(cells, min(chunk, cells) if pieces else cells)


def context_failure(size: EmbedContextSize, longest: int, limit: int, pieces: bool) -> EngineError:
    """The error for the request whose embedding context (``size``, for an
    input of ``longest`` tokens) llama.cpp could not make: the runner goes
    on. A 400 (``InputError``) where the input's length asked for more than
    the smallest context, so that shorter inputs are the way out; else the
    machine is short of memory for any embedding."""
    text = (
        f"failed to create the embedding context ({size.n_ctx} tokens, "
        f"{size.n_batch} a batch): llama.cpp could not allocate it (out of memory?)"
    )
    if size.n_ctx <= embed_context_size(0, limit, pieces).n_ctx:
        return EngineError(text)
    return InputError(f"{text}; an input of {longest} tokens asked for it: send shorter inputs")


def vector_text(vector: list[float], encoding: str) -> str:
    """One vector as the JSON text the response holds for it: an array of
    numbers, or (OpenAI's ``encoding_format: base64``) a string."""
    if encoding == "base64":
        packed = struct.pack(f"<{len(vector)}f", *vector)
        return '"' + base64.b64encode(packed).decode() + '"'
    return json.dumps(vector, separators=(",", ":"))


class FairShare:
    """How much of the loop embeddings get: measured, not assumed.

    A chunk aims at the time of one decode step of the completions (their
    running average), so a stream waits about one step more at a time, and
    never more than one chunk; its size in tokens follows the measured cost
    per token, from ``MIN_CHUNK_TOKENS`` up to ``EMBED_CHUNK_TOKENS``. While
    completions run, each step earns the embeddings ``EMBED_SHARE`` of its
    time as credit, and a turn (tokenizing or one chunk) runs once the
    credit covers its expected time, paying its real time back: over any
    stretch the embeddings take at most that share of the loop, even where
    a chunk costs more than a step. With no completion running they take
    every turn, in chunks of the same size, so a completion that arrives
    waits one short chunk.
    """

    def __init__(self, share: float = EMBED_SHARE, max_tokens: int = EMBED_CHUNK_TOKENS) -> None:
        self.share = share
        self.max_tokens = max_tokens
        self.step_seconds: float | None = None  # running average of a decode step
        self.token_seconds: float | None = None  # running average per embedded token
        self.credit = 0.0
        self.last_tokens = MIN_CHUNK_TOKENS

    def stepped(self, seconds: float) -> None:
        """A decode step of the completions took ``seconds``."""
        self.step_seconds = average(self.step_seconds, seconds)
        most = max(self.step_seconds, self.turn_cost())  # no more saved than one turn needs
        self.credit = min(self.credit + self.share * seconds, most)

    def may_run(self, completions: bool) -> bool:
        """May an embedding turn run now? Always when no completion runs;
        else once the steps have earned what the turn is expected to cost
        (paid before, not after: a short answer that arrives is not
        followed by a chunk at once)."""
        if not completions:
            self.credit = 0.0  # no debt, and no savings, towards streams that are gone
            return True
        return self.credit >= self.turn_cost()

    def turn_cost(self) -> float:
        """The time the next turn is expected to take."""
        if self.token_seconds is None:
            return self.step_seconds or 0.0
        return self.token_seconds * self.chunk_tokens()

    @property
    def chunk_seconds(self) -> float | None:
        """The time a turn aims at: one decode step (None before any was timed)."""
        return self.step_seconds

    def chunk_tokens(self) -> int:
        """Tokens the next chunk may take (whole inputs: at least one)."""
        target = self.chunk_seconds
        if target is None:  # no decode step yet: nothing to share with
            return self.max_tokens
        least = min(MIN_CHUNK_TOKENS, self.max_tokens)
        if self.token_seconds is None:
            return least
        tokens = int(target / self.token_seconds)
        return max(least, min(tokens, 2 * self.last_tokens, self.max_tokens))

    def ran(self, seconds: float, tokens: int, completions: bool) -> None:
        """A turn took ``seconds`` (``tokens``: embedded in it, 0 for tokenizing)."""
        if tokens:
            self.token_seconds = average(self.token_seconds, seconds / tokens)
            self.last_tokens = tokens
        if completions:
            self.credit -= seconds


def average(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
