"""The embeddings' own llama context over the model's weights, and the
turns that advance embed requests in it.

The batch loop (``runner.engine``) gives the embeddings a turn between two
of its decode steps; ``turn`` takes it when the loop's ``FairShare`` allows
(``runner.embedding``: the policy and the bookkeeping) and spends it
tokenizing inputs or embedding one chunk of them. The context is made on
first use, small, and made again larger when a longer input comes.
Runs in the runner process only; everything here blocks.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

import llama_cpp

from jupyter_llm.memory.measured import Sizes, grown
from jupyter_llm.runner.embedding import (
    EMBED_SEQS,
    EmbedContextSize,
    EmbedJob,
    FairShare,
    context_failure,
    embed_context_size,
    vector_text,
)
from jupyter_llm.runner.last_rows import LastRows
from jupyter_llm.runner.llama_backend import allocation_log
from jupyter_llm.runner.model import Model
from jupyter_llm.runner.pooling import POOLING_NAMES, embedding_pooling, finish_vector, fit_tokens
from jupyter_llm.runner.protocol import EngineError, InputError

PREFIX_MARGIN = 16  # tokens past the limit where a prefix's cut cannot reach


def prefix_end(text: str, size: int) -> int:
    """Where a prefix of about ``size`` characters ends: before a space in its
    second half (so no word is cut), else at ``size``."""
    cut = text.rfind(" ", size // 2, size)
    return cut if cut > 0 else size


class EmbeddingContext:
    """Embed requests of one model: queued, advanced a turn at a time."""

    def __init__(self, model: Model, n_ctx: int, n_threads: int) -> None:
        self.model = model
        # tokens of one input: at most the chat context, and at most what the model
        # was trained on (llama.cpp rounds a context up; a bert model has no
        # positions past it)
        self.limit = min(n_ctx, model.n_ctx_train or n_ctx)
        self._n_threads = n_threads
        self._ctx: Any = None
        self._batch: Any = None
        self._size: EmbedContextSize | None = None  # of _ctx, as asked
        self._pooling: int | None = None  # once the first context has read it
        self._splits = False  # may a long input be decoded in pieces?
        # set where the model pools by its last token and its graph names its final
        # norm: contexts made for generation, outputs only the rows pooled (last_rows)
        self._last_rows: LastRows | None = None
        # what the context held now allocates, from llama.cpp's log (none while closed)
        self.allocations: Sizes = {}
        self._made: Sizes = {}  # of the last context made
        self.jobs: deque[EmbedJob] = deque()  # advanced a turn at a time (``turn``)
        self.share = FairShare()

    # -- the context -----------------------------------------------------------------
    def _make(self, pooling: int, size: EmbedContextSize) -> Any:
        """A context for embeddings of ``size`` (``embed_context_size``), or
        None where llama.cpp could not make it (memory)."""
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = size.n_ctx
        cp.n_batch = cp.n_ubatch = size.n_batch
        cp.n_seq_max = EMBED_SEQS  # the inputs of one chunk, one sequence each
        cp.kv_unified = True  # and any one of them may fill the context
        if self._last_rows is not None:  # every token an output would run the output layer
            cp.cb_eval = self._last_rows.callback
            cp.n_outputs_max = EMBED_SEQS  # a row per input: the graph's logits are this many
        else:
            cp.embeddings = True
            cp.pooling_type = pooling
        cp.n_threads, cp.n_threads_batch = self._n_threads, self._n_threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        before = allocation_log.snapshot()
        ctx = llama_cpp.llama_init_from_model(self.model.llama_model, cp) or None
        self._made = grown(allocation_log.snapshot(), before) if ctx else {}
        return ctx

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
        self._ctx = self._batch = self._size = None
        self.allocations = {}

    def _open(self, longest: int = 0) -> None:
        """The context (sharing the model's weights), pooled as the model
        declares (``pooling.embedding_pooling``), sized for inputs of
        ``longest`` tokens (``embed_context_size``): made small on first use,
        made again larger when a longer input comes. A context that cannot be
        made fails the request that needed it (``context_failure``), not the
        runner."""
        if self._pooling is None:
            self._open_first()
        held = self._size.n_ctx if self._size is not None else 0
        size = embed_context_size(longest, self.limit, self._splits, held)
        if size == self._size:
            return
        self.close()  # before the larger one: both would not fit where it matters
        assert self._pooling is not None
        ctx = self._make(self._pooling, size)
        if ctx is None:
            raise context_failure(size, longest, self.limit, self._splits)
        self._use(ctx, size)

    def _open_first(self) -> None:
        """The first context: it reads what pooling the model declares, and
        how this model may embed (``_splits``, ``_last_rows``)."""
        # it decodes nothing (llama.cpp wants room for an output per sequence)
        probe_size = EmbedContextSize(min(256, self.limit), EMBED_SEQS)
        ctx = self._make(llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED, probe_size)
        if ctx is None:
            raise context_failure(probe_size, 0, self.limit, pieces=False)
        try:
            declared = llama_cpp.llama_pooling_type(ctx)
            pooling = embedding_pooling(declared)
            # An input longer than a chunk may be decoded in pieces only where
            # the vector is the last token's state under causal attention (a
            # cache carries the earlier pieces); mean or CLS pooling, or an
            # encoder that attends both ways, needs the whole input in one batch.
            self._splits = (
                pooling == llama_cpp.LLAMA_POOLING_TYPE_LAST
                and bool(llama_cpp.llama_get_memory(ctx))
                and bool(llama_cpp.llama_get_causal_attn(ctx))
            )
        finally:
            llama_cpp.llama_free(ctx)
        self._pooling = pooling
        size = embed_context_size(0, self.limit, self._splits)
        if self._splits and not self._reorders_outputs():
            self._last_rows = LastRows(self.model.n_embd)
        ctx = self._make(pooling, size)
        if self._last_rows is not None and not (ctx and self._reads_last_rows(ctx)):
            if ctx:  # its graph names no final norm: pooled by llama.cpp
                llama_cpp.llama_free(ctx)
            self._last_rows = None
            ctx = self._make(pooling, size)
        if ctx is None:
            raise context_failure(size, 0, self.limit, self._splits)
        self._use(ctx, size)
        name = POOLING_NAMES.get(pooling, str(pooling))
        declares = POOLING_NAMES.get(declared, "none")
        how = ", reading the last rows only" if self._last_rows is not None else ""
        sys.stderr.write(f"embeddings pool by {name} (the model declares {declares}){how}\n")

    def _reorders_outputs(self) -> bool:
        """Whether llama.cpp may compute a chunk's outputs out of its inputs'
        order: recurrent and hybrid memories split a batch into equal-length
        ubatches (a short input ends first) and put the outputs back in order
        only where it copies them out, after the eval callback has seen them."""
        return self.model.recurrent

    def _reads_last_rows(self, ctx: Any) -> bool:
        """Whether a decode of two tokens, the second the only output, gives
        that one row of the final norm in ``ctx`` (a model's graph may name it
        otherwise, or keep every token's row)."""
        assert self._last_rows is not None
        batch = llama_cpp.llama_batch_init(2, 0, 1)
        token = max(llama_cpp.llama_vocab_bos(self.model.vocab), 0)
        try:
            for i in range(2):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, i
                batch.seq_id[i][0] = 0
            batch.n_tokens = 2
            self._last_rows.clear()
            ok = llama_cpp.llama_decode(ctx, batch) == 0
            ok = ok and len(self._last_rows.rows) == 1 and not self._last_rows.failed
        finally:
            llama_cpp.llama_batch_free(batch)
            self._last_rows.clear()
        if ok:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), False)
        return ok

    def _use(self, ctx: Any, size: EmbedContextSize) -> None:
        self._ctx, self._size = ctx, size
        self.allocations = self._made
        self._batch = llama_cpp.llama_batch_init(size.n_batch, 0, 1)

    # -- requests --------------------------------------------------------------------
    def submit(self, job: EmbedJob) -> None:
        """Queue an embed request; the loop advances it between decode steps
        (``turn``). Embeddings pool as the model declares (``runner.pooling``);
        ``normalize`` None: as Ollama's legacy route does for this model."""
        if self._ctx is None:
            self._open()
        if job.normalize is None:
            job.normalize = self.model.legacy_normalizes()
        self.jobs.append(job)

    def turn(self, step_seconds: float | None, streams: bool) -> bool:
        """After a decode step of the completions (``step_seconds`` long; None
        when none ran; ``streams``: completions still running), one turn of
        the next embed request, if the ``FairShare`` allows: tokenizing some
        of its inputs, or embedding one chunk of them. Requests take turns; a
        failure ends its request only. True if a turn ran."""
        if step_seconds is not None:
            self.share.stepped(step_seconds)
        if not self.jobs or not self.share.may_run(streams):
            return False
        job = self.jobs[0]
        started = time.perf_counter()
        tokens = 0
        try:
            if job.cancelled():
                raise EngineError("cancelled")
            if job.tokenized:
                tokens = self._embed_chunk(job)
            else:
                self._tokenize_turn(job, started)
        except Exception as e:
            self.jobs.remove(job)
            job.tokens.clear()
            job.fail(e)
        else:
            if job.tokenized and job.embedded == len(job.texts):
                self.jobs.remove(job)
                job.finish(job.counted)
            elif not job.fed:  # an input split over chunks keeps the context to itself
                self.jobs.rotate(-1)
        self.share.ran(time.perf_counter() - started, tokens, streams)
        return True

    def _tokenize_turn(self, job: EmbedJob, started: float) -> None:
        """Tokenize the next inputs until this turn has used its time (at
        least one input); ``EmbedJob.add_tokens`` checks the total."""
        target = self.share.chunk_seconds
        budget = self.share.chunk_tokens()
        done = 0
        while not job.tokenized:
            tokens = self.input_tokens(job.texts[len(job.tokens)], job.truncate)
            job.add_tokens(tokens)
            done += len(tokens)
            if done >= budget or (target is not None and time.perf_counter() - started >= target):
                return

    def input_tokens(self, text: str, truncate: bool) -> list[int]:
        """One input's tokens within ``limit``: cut as ``fit_tokens`` does,
        or an ``InputError`` without ``truncate``. A long text is tokenized
        by growing prefixes (ending at a space) until one has more tokens than
        the limit, so the work is bounded by the limit, not by the text."""
        limit = self.limit
        size = 4 * (limit + PREFIX_MARGIN)
        while True:
            whole = len(text) <= size
            head = text if whole else text[: prefix_end(text, size)]
            tokens = self.model.tokenize(head, add_special=True, parse_special=False) or [
                llama_cpp.llama_vocab_bos(self.model.vocab)
            ]
            if whole or len(tokens) > limit + PREFIX_MARGIN:
                break
            size *= 4
        if len(tokens) > limit:
            if not truncate:
                count = f"{len(tokens)}" if whole else f"more than {limit}"
                raise InputError(
                    f"input length ({count} tokens) exceeds the context length ({limit})"
                )
            plain = self.model.tokenize(head, add_special=False, parse_special=False)
            tokens = fit_tokens(tokens, plain, limit)
        return tokens

    # -- decoding --------------------------------------------------------------------
    def _embed_chunk(self, job: EmbedJob) -> int:
        """Embed the next inputs of ``job`` (as many whole ones as the share's
        chunk allows, each its own sequence) in one ``llama_decode``; their
        vectors go to ``job.emit``. Returns the tokens decoded."""
        self._open(job.longest)  # larger, if an input needs it
        assert self._size is not None
        budget = min(self.share.chunk_tokens(), self._size.n_batch)
        if job.fed or (
            self._splits
            and job.embedded < len(job.tokens)
            and len(job.tokens[job.embedded]) > budget
        ):
            return self._embed_piece(job, budget)
        count = job.next_chunk(budget)
        if count == 0:
            return 0
        memory = llama_cpp.llama_get_memory(self._ctx)
        if memory:
            llama_cpp.llama_memory_clear(memory, False)  # the cells; zeroing the buffers is waste
        first = job.embedded
        b = self._batch
        every = self._last_rows is None  # pooled by llama.cpp: all tokens are its outputs
        n = 0
        for seq in range(count):
            tokens = job.tokens[first + seq]
            last = len(tokens) - 1
            for i, token in enumerate(tokens):
                b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, i, 1, every or i == last
                b.seq_id[n][0] = seq
                n += 1
        b.n_tokens = n
        self._decode(b, outputs=count)
        vectors = [self._vector(seq, job) for seq in range(count)]
        for seq in range(count):
            job.tokens[first + seq] = job.tokens[first + seq][:0]  # done with them
        job.embedded += count
        job.emit(vectors)
        return n

    def _decode(self, batch: Any, outputs: int) -> None:
        """``llama_decode`` of an embedding batch whose sequences end in
        ``outputs`` pooled rows (read by ``_vector``)."""
        if self._last_rows is not None:
            self._last_rows.clear()
        if llama_cpp.llama_decode(self._ctx, batch) != 0:
            raise EngineError("llama_decode failed while embedding")
        if self._last_rows is not None and (
            self._last_rows.failed or len(self._last_rows.rows) != outputs
        ):
            why = self._last_rows.failed or f"{len(self._last_rows.rows)} rows for {outputs}"
            raise EngineError(f"the model produced no embedding ({why})")

    def _vector(self, seq: int, job: EmbedJob) -> str:
        """The pooled vector of sequence ``seq`` (its place among the outputs
        of the last decode) as the response holds it."""
        if self._last_rows is not None:
            row = self._last_rows.rows[seq]
        else:
            pointer = llama_cpp.llama_get_embeddings_seq(self._ctx, seq)
            if not pointer:
                raise EngineError("the model produced no embedding")
            row = pointer[: self.model.n_embd]
        vector = finish_vector(list(row), job.dimensions, bool(job.normalize))
        return vector_text(vector, job.encoding)

    def _embed_piece(self, job: EmbedJob, budget: int) -> int:
        """The next ``budget`` tokens of an input longer than a chunk, into the
        context's cache (causal attention: the later pieces see the earlier
        ones); after its last piece, its vector (the last token's state, as
        decoding it whole gives). Returns the tokens decoded."""
        tokens = job.tokens[job.embedded]
        start = job.fed
        end = min(len(tokens), start + budget)
        memory = llama_cpp.llama_get_memory(self._ctx)
        if start == 0:
            llama_cpp.llama_memory_clear(memory, False)  # the cells; zeroing the buffers is waste
        b = self._batch
        every = self._last_rows is None  # pooled by llama.cpp: all tokens are its outputs
        for i in range(end - start):
            out = every or start + i == len(tokens) - 1
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tokens[start + i], start + i, 1, out
            b.seq_id[i][0] = 0
        b.n_tokens = end - start
        self._decode(b, outputs=int(end == len(tokens)))
        job.fed = end
        if end == len(tokens):
            vector = self._vector(0, job)
            job.tokens[job.embedded] = tokens[:0]
            job.embedded += 1
            job.fed = 0
            job.emit([vector])
        return end - start
