"""The runner's engine: one model, one context holding ``n_seq`` sequences,
decoding with llama.cpp's C API (continuous batching).

Each ``step`` puts into one ``llama_decode`` the next token of every
generating sequence and a chunk of any pending prompt, then samples each
sequence with its own native sampler chain. A finished sequence frees its
slot at once; its tokens stay cached, and the next request goes to the idle
slot whose cache shares the longest prefix with its prompt. The KV cache is
unified: all sequences share ``n_ctx`` cells, so a single user has the whole
context and more users cost no more memory. The high-level ``llama_cpp.Llama``
is not used: it serves one sequence and spends Python time per token.
With a projector, prompts may hold images (``runner.vision``): each image is
decoded on its own for its sequence between two steps, one image per step,
so the other sequences keep streaming around an image prompt. Embed requests
are jobs too, advanced a turn at a time between decode steps within their
share of the loop (``runner.embedding``), in a second context.
Runs in the runner process only; everything here blocks.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

from jupyter_llm.chat_formats.builtin import choose_builtin
from jupyter_llm.limits import repeat_window
from jupyter_llm.memory.measured import AllocationLog
from jupyter_llm.options import DEFAULT_SAMPLING  # Ollama's api.DefaultOptions
from jupyter_llm.runner.chat_template import ChatTemplate
from jupyter_llm.runner.constrained import Candidates, TokenTable, token_piece
from jupyter_llm.runner.context_window import (
    SlotView,
    Span,
    choose_slot,
    inside,
    num_keep,
    shift_span,
    swa_reusable,
    truncation,
)
from jupyter_llm.runner.embedding import (
    EMBED_SEQS,
    EmbedContextSize,
    EmbedJob,
    FairShare,
    context_failure,
    embed_context_size,
    vector_text,
)
from jupyter_llm.runner.pooling import (
    POOLING_NAMES,
    embedding_pooling,
    finish_vector,
    fit_tokens,
    legacy_normalizes,
)
from jupyter_llm.runner.protocol import EngineError, InputError
from jupyter_llm.runner.sequence import Completion, Job, Sequence, make_sampler
from jupyter_llm.runner.vision import ImagePrompt, Part, Vision, split_plain

Emit = Callable[[str], None]
Cancelled = Callable[[], bool]


@dataclass
class LoadParams:
    path: str
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0
    main_gpu: int = 0
    tensor_split: list[float] = field(default_factory=list)
    use_mmap: bool = True
    flash_attn: bool = False
    n_seq: int = 1  # sequences decoded together, sharing the n_ctx cells
    projector: str = ""  # the image projector (mmproj GGUF) to load beside the model


_backend_ready = False
_LOG_DEBUG, _LOG_CONT = 1, 5  # enum ggml_log_level
_log_state = {"keep": True}
allocation_log = AllocationLog()  # what the current load allocated, per device


@llama_cpp.llama_log_callback
def _log_to_stderr(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's INFO and up go to stderr, which the server reads (buffer
    sizes, errors); DEBUG lines are dropped."""
    keep = _log_state["keep"] if level == _LOG_CONT else level != _LOG_DEBUG
    _log_state["keep"] = keep
    if keep:
        line = text.decode(errors="replace")
        allocation_log.feed(line)
        sys.stderr.write(line)
        sys.stderr.flush()


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does this (Linux) CPU advertise AMX, whose llama.cpp kernels we avoid?"""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_to_stderr, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


PREFIX_MARGIN = 16  # tokens past the limit where a prefix's cut cannot reach


def prefix_end(text: str, size: int) -> int:
    """Where a prefix of about ``size`` characters ends: before a space in its
    second half (so no word is cut), else at ``size``."""
    cut = text.rfind(" ", size // 2, size)
    return cut if cut > 0 else size


class Engine:
    def __init__(self, params: LoadParams, progress: Callable[[float], None] | None = None) -> None:
        _init_backend()
        mp = llama_cpp.llama_model_default_params()
        if progress is not None:

            def on_progress(value: float, _: ctypes.c_void_p) -> bool:
                progress(float(value))
                return True

            self._progress_cb = llama_cpp.llama_progress_callback(on_progress)
            mp.progress_callback = self._progress_cb
        mp.n_gpu_layers = params.n_gpu_layers
        if cpu_has_amx():
            # llama.cpp's AMX kernels crash on real quantized models on some
            # Sapphire Rapids machines (ggml-org/llama.cpp#20824, unfixed): the
            # weights stay in plain CPU buffers there
            mp.use_extra_bufts = False
        mp.main_gpu = params.main_gpu
        mp.use_mmap = params.use_mmap
        self._tensor_split = None
        if params.tensor_split:
            self._tensor_split = (ctypes.c_float * len(params.tensor_split))(*params.tensor_split)
            mp.tensor_split = self._tensor_split
        self.model = llama_cpp.llama_model_load_from_file(params.path.encode(), mp)
        if not self.model:
            raise EngineError(f"failed to load model {params.path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)
        n_ctx = max(16, min(params.n_ctx, self.n_ctx_train or params.n_ctx))
        self.n_seq = max(1, min(params.n_seq, 256))
        # every generating sequence's token fits in a step beside a prompt chunk
        self.n_batch = max(1, self.n_seq, min(params.n_batch, n_ctx))
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = self.n_batch
        cp.n_ubatch = self.n_batch
        cp.n_seq_max = self.n_seq
        cp.kv_unified = True
        # windowed layers keep only their window (as llama-server and Ollama);
        # a cached prefix is then reusable only while its window is still held
        cp.swa_full = False
        self.n_swa = int(llama_cpp.llama_model_n_swa(self.model))
        # llama.cpp's default (auto: on where the backend has it), as
        # llama-server; about 5 % more tokens/s with 4 streams on the CPU
        cp.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if params.flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        )
        if params.n_threads > 0:
            cp.n_threads = params.n_threads
            cp.n_threads_batch = params.n_threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise EngineError("failed to create the llama context (out of memory?)")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.slots = [Slot(i) for i in range(self.n_seq)]
        self.waiting: deque[Sequence] = deque()
        self._can_shift = bool(llama_cpp.llama_memory_can_shift(self.memory))
        self._piece = ctypes.create_string_buffer(256)
        self.tokens = TokenTable(
            self.vocab,
            self.n_vocab,
            self._piece_bytes,
            lambda text: self.tokenize(text, add_special=False, parse_special=False),
        )
        self.candidates = Candidates(self.n_vocab)  # shared: sequences sample one by one
        self._reading_vocab = self.tokens.prepare()
        # the GGUF's own template, or its family's built-in one (named here)
        self.chat_template, self.builtin_template = self._chat_template_source()
        self._chat: ChatTemplate | None = None
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._n_threads = params.n_threads if params.n_threads > 0 else cp.n_threads
        self._embed_ctx: Any = None
        self._embed_batch: Any = None
        self._embed_size: EmbedContextSize | None = None  # of _embed_ctx, as asked
        self._embed_pooling: int | None = None  # once the first context has read it
        self._embed_splits = False  # may a long input be decoded in pieces?
        self.embed_jobs: deque[EmbedJob] = deque()  # advanced a turn at a time (``embed_turn``)
        self.share = FairShare()
        self.beat: Callable[[], None] = lambda: None  # progress between decode steps
        self.vision: Vision | None = None
        if params.projector:
            try:  # on the GPU where the model's layers are
                self.vision = Vision(
                    params.projector, self.model, self._n_threads, params.n_gpu_layers != 0
                )
            except EngineError:
                self.close()
                raise

    def close(self) -> None:
        if getattr(self, "_reading_vocab", None) is not None:
            self._reading_vocab.join()  # it reads the vocabulary freed below
            self._reading_vocab = None
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        self._close_embedding()
        if self.ctx:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            llama_cpp.llama_model_free(self.model)
            self.ctx = None

    # -- model facts -----------------------------------------------------------------
    def metadata(self, key: str) -> str:
        """A metadata value as text; a long one (a chat template over 64 KiB)
        is read again whole rather than cut."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode(errors="replace") if n >= 0 else ""

    def token_text(self, token: int, special: bool = True) -> str:
        return self._piece_bytes(token, special).decode(errors="replace")

    def _piece_bytes(self, token: int, special: bool = False) -> bytes:
        return token_piece(self.vocab, token, special, self._piece)

    def control_tokens(self, markers: Iterable[str]) -> frozenset[int]:
        """The ids of those ``markers`` that are one control token of this
        vocabulary (rendered as nothing unless kept, see ``Job.preserve``)."""
        found = set()
        for marker in markers:
            ids = self.tokenize(marker, add_special=False, parse_special=True)
            if len(ids) == 1 and not self._piece_bytes(ids[0], special=False):
                found.add(ids[0])
        return frozenset(found)

    def tokenize(
        self, text: str | bytes, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, cap, add_special, parse_special
            )
        return list(buf[:n])

    # -- prompts ---------------------------------------------------------------------
    def _chat_template_source(self) -> tuple[str, str]:
        """The chat template and, where the GGUF has none and the model's
        family is known, the name of the built-in one chosen for it (""
        where it is the GGUF's own, or where nothing is known)."""
        own = self.metadata("tokenizer.chat_template")
        if own:
            return own, ""
        builtin = choose_builtin(
            self.metadata("general.architecture"),
            self._has_marker,
            self.metadata("tokenizer.ggml.pre"),
        )
        return (builtin.source, builtin.name) if builtin else ("", "")

    def _has_marker(self, text: str) -> bool:
        """Whether ``text`` is one control or user-defined token (as the
        server reads a GGUF's token types, ``models.gguf_info.marker_tokens``)."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        marker = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        return len(ids) == 1 and bool(llama_cpp.llama_vocab_get_attr(self.vocab, ids[0]) & marker)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The model's chat template (Jinja2, as transformers renders it), with
        its work bounded (``chat_template``: a hostile template is a 400); a
        model without one and of no known family gets ``role: content`` lines."""
        if not self.chat_template:
            lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
            return "\n".join([*lines, "assistant: "])
        if self._chat is None:
            bos = llama_cpp.llama_vocab_bos(self.vocab)
            eos = llama_cpp.llama_vocab_eos(self.vocab)
            self._chat = ChatTemplate(
                self.chat_template,
                bos_token=self.token_text(bos) if bos >= 0 else "",
                eos_token=self.token_text(eos) if eos >= 0 else "",
            )
        return self._chat.render(messages, tools, variables)

    def fill_in_the_middle(self, prefix: str, suffix: str) -> list[int]:
        ids = (
            llama_cpp.llama_vocab_fim_pre(self.vocab),
            llama_cpp.llama_vocab_fim_suf(self.vocab),
            llama_cpp.llama_vocab_fim_mid(self.vocab),
        )
        if min(ids) < 0:
            raise InputError("this model does not support insert (no fill-in-the-middle tokens)")
        pre, suf, mid = ids
        return [
            pre,
            *self.tokenize(prefix, add_special=False),
            suf,
            *self.tokenize(suffix, add_special=False),
            mid,
        ]

    @property
    def supports_insert(self) -> bool:
        return llama_cpp.llama_vocab_fim_pre(self.vocab) >= 0

    # -- embeddings ------------------------------------------------------------------
    @property
    def n_embd(self) -> int:
        """The length of an embedding (the output size where a model projects)."""
        return int(llama_cpp.llama_model_n_embd_out(self.model))

    def _embedding_context(self, pooling: int, size: EmbedContextSize) -> Any:
        """A context for embeddings of ``size`` (``embed_context_size``), or
        None where llama.cpp could not make it (memory)."""
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = size.n_ctx
        cp.n_batch = cp.n_ubatch = size.n_batch
        cp.n_seq_max = EMBED_SEQS  # the inputs of one chunk, one sequence each
        cp.kv_unified = True  # and any one of them may fill the context
        cp.embeddings = True
        cp.pooling_type = pooling
        cp.n_threads, cp.n_threads_batch = self._n_threads, self._n_threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        return llama_cpp.llama_init_from_model(self.model, cp) or None

    def _close_embedding(self) -> None:
        if self._embed_ctx:
            llama_cpp.llama_batch_free(self._embed_batch)
            llama_cpp.llama_free(self._embed_ctx)
        self._embed_ctx = self._embed_batch = self._embed_size = None

    def _open_embedding(self, longest: int = 0) -> None:
        """The second context (sharing the model's weights), pooled as the
        model declares (``pooling.embedding_pooling``), sized for inputs of
        ``longest`` tokens (``embed_context_size``): made small on first use,
        made again larger when a longer input comes. A context that cannot be
        made fails the request that needed it (``context_failure``), not the
        runner."""
        limit = self.embed_limit
        if self._embed_pooling is None:  # first use: what the model declares, and may do
            size = embed_context_size(0, limit, pieces=False)
            ctx = self._embedding_context(llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED, size)
            if ctx is None:
                raise context_failure(size, 0, limit, pieces=False)
            declared = llama_cpp.llama_pooling_type(ctx)
            try:
                pooling = embedding_pooling(declared)
            except InputError:
                llama_cpp.llama_free(ctx)
                raise
            # An input longer than a chunk may be decoded in pieces only where
            # the vector is the last token's state under causal attention (a
            # cache carries the earlier pieces); mean or CLS pooling, or an
            # encoder that attends both ways, needs the whole input in one batch.
            self._embed_splits = (
                pooling == llama_cpp.LLAMA_POOLING_TYPE_LAST
                and bool(llama_cpp.llama_get_memory(ctx))
                and bool(llama_cpp.llama_get_causal_attn(ctx))
            )
            self._embed_pooling = pooling
            if pooling == declared:  # the smallest context, as needed at first
                self._use_embedding(ctx, size)
            else:
                llama_cpp.llama_free(ctx)
            name = POOLING_NAMES.get(pooling, str(pooling))
            declares = POOLING_NAMES.get(declared, "none")
            sys.stderr.write(f"embeddings pool by {name} (the model declares {declares})\n")
        held = self._embed_size.n_ctx if self._embed_size is not None else 0
        size = embed_context_size(longest, limit, self._embed_splits, held)
        if size == self._embed_size:
            return
        self._close_embedding()  # before the larger one: both would not fit where it matters
        ctx = self._embedding_context(self._embed_pooling, size)
        if ctx is None:
            raise context_failure(size, longest, limit, self._embed_splits)
        self._use_embedding(ctx, size)

    def _use_embedding(self, ctx: Any, size: EmbedContextSize) -> None:
        self._embed_ctx, self._embed_size = ctx, size
        self._embed_batch = llama_cpp.llama_batch_init(size.n_batch, 0, 1)

    def legacy_normalizes(self) -> bool:
        """Whether the legacy ``/api/embeddings`` normalises this model's vectors."""
        arch = self.metadata("general.architecture")
        flag = self.metadata(f"{arch}.normalize_embeddings").lower()
        return legacy_normalizes(
            arch,
            declares_pooling=bool(self.metadata(f"{arch}.pooling_type")),
            tokenizer=self.metadata("tokenizer.ggml.model"),
            normalize_embeddings={"true": True, "false": False}.get(flag),
        )

    @property
    def embed_limit(self) -> int:
        """Tokens of one input: at most the context, and at most what the model
        was trained on (llama.cpp rounds a context up; a bert model has no
        positions past it)."""
        return min(self.n_ctx, self.n_ctx_train or self.n_ctx)

    def submit_embed(self, job: EmbedJob) -> None:
        """Queue an embed request; the loop advances it between decode steps
        (``embed_turn``). Embeddings pool as the model declares
        (``runner.pooling``); ``normalize`` None: as Ollama's legacy route
        does for this model."""
        if self._embed_ctx is None:
            self._open_embedding()
        if job.normalize is None:
            job.normalize = self.legacy_normalizes()
        self.embed_jobs.append(job)

    def embed_turn(self, step_seconds: float | None) -> None:
        """After a decode step of the completions (``step_seconds`` long; None
        when none ran), one turn of the next embed request, if the loop's
        ``FairShare`` allows: tokenizing some of its inputs, or embedding one
        chunk of them. Requests take turns; a failure ends its request only."""
        if step_seconds is not None:
            self.share.stepped(step_seconds)
        streams = self.streaming
        if not self.embed_jobs or not self.share.may_run(streams):
            return
        job = self.embed_jobs[0]
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
            self.embed_jobs.remove(job)
            job.tokens.clear()
            job.fail(e)
        else:
            if job.tokenized and job.embedded == len(job.texts):
                self.embed_jobs.remove(job)
                job.finish(job.counted)
            elif not job.fed:  # an input split over chunks keeps the context to itself
                self.embed_jobs.rotate(-1)
        self.share.ran(time.perf_counter() - started, tokens, streams)
        self.beat()

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
        """One input's tokens within ``embed_limit``: cut as ``fit_tokens`` does,
        or an ``InputError`` without ``truncate``. A long text is tokenized
        by growing prefixes (ending at a space) until one has more tokens than
        the limit, so the work is bounded by the limit, not by the text."""
        limit = self.embed_limit
        size = 4 * (limit + PREFIX_MARGIN)
        while True:
            whole = len(text) <= size
            head = text if whole else text[: prefix_end(text, size)]
            tokens = self.tokenize(head, add_special=True, parse_special=False) or [
                llama_cpp.llama_vocab_bos(self.vocab)
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
            plain = self.tokenize(head, add_special=False, parse_special=False)
            tokens = fit_tokens(tokens, plain, limit)
        return tokens

    def _embed_chunk(self, job: EmbedJob) -> int:
        """Embed the next inputs of ``job`` (as many whole ones as the share's
        chunk allows, each its own sequence) in one ``llama_decode``; their
        vectors go to ``job.emit``. Returns the tokens decoded."""
        self._open_embedding(job.longest)  # larger, if an input needs it
        assert self._embed_size is not None
        budget = min(self.share.chunk_tokens(), self._embed_size.n_batch)
        if job.fed or (
            self._embed_splits
            and job.embedded < len(job.tokens)
            and len(job.tokens[job.embedded]) > budget
        ):
            return self._embed_piece(job, budget)
        count = job.next_chunk(budget)
        if count == 0:
            return 0
        memory = llama_cpp.llama_get_memory(self._embed_ctx)
        if memory:
            llama_cpp.llama_memory_clear(memory, False)  # the cells; zeroing the buffers is waste
        first = job.embedded
        b = self._embed_batch
        n = 0
        for seq in range(count):
            for i, token in enumerate(job.tokens[first + seq]):
                b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, i, 1, 1
                b.seq_id[n][0] = seq
                n += 1
        b.n_tokens = n
        if llama_cpp.llama_decode(self._embed_ctx, b) != 0:
            raise EngineError("llama_decode failed while embedding")
        n_embd = self.n_embd
        vectors = []
        for seq in range(count):
            pointer = llama_cpp.llama_get_embeddings_seq(self._embed_ctx, seq)
            if not pointer:
                raise EngineError("the model produced no embedding")
            vector = finish_vector(list(pointer[:n_embd]), job.dimensions, bool(job.normalize))
            vectors.append(vector_text(vector, job.encoding))
            job.tokens[first + seq] = job.tokens[first + seq][:0]  # done with them
        job.embedded += count
        job.emit(vectors)
        return n

    def _embed_piece(self, job: EmbedJob, budget: int) -> int:
        """The next ``budget`` tokens of an input longer than a chunk, into the
        context's cache (causal attention: the later pieces see the earlier
        ones); after its last piece, its vector (the last token's state, as
        decoding it whole gives). Returns the tokens decoded."""
        tokens = job.tokens[job.embedded]
        start = job.fed
        end = min(len(tokens), start + budget)
        memory = llama_cpp.llama_get_memory(self._embed_ctx)
        if start == 0:
            llama_cpp.llama_memory_clear(memory, False)  # the cells; zeroing the buffers is waste
        b = self._embed_batch
        for i in range(end - start):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tokens[start + i], start + i, 1, 1
            b.seq_id[i][0] = 0
        b.n_tokens = end - start
        if llama_cpp.llama_decode(self._embed_ctx, b) != 0:
            raise EngineError("llama_decode failed while embedding")
        job.fed = end
        if end == len(tokens):
            pointer = llama_cpp.llama_get_embeddings_seq(self._embed_ctx, 0)
            if not pointer:
                raise EngineError("the model produced no embedding")
            vector = finish_vector(
                list(pointer[: self.n_embd]), job.dimensions, bool(job.normalize)
            )
            job.tokens[job.embedded] = tokens[:0]
            job.embedded += 1
            job.fed = 0
            job.emit([vector_text(vector, job.encoding)])
        return end - start

    # -- continuous batching -----------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Anything to decode, waiting for a slot, or to embed?"""
        return self.streaming or bool(self.embed_jobs)

    @property
    def streaming(self) -> bool:
        """Any completion decoding or waiting for a slot?"""
        return bool(self.waiting) or any(s.seq is not None for s in self.slots)

    @property
    def active_ids(self) -> list[int]:
        """Request ids in slots, waiting, or embedding (read by the health thread)."""
        ids = [s.seq.job.rid for s in list(self.slots) if s.seq is not None]
        ids += [q.job.rid for q in list(self.waiting)]
        return ids + [j.rid for j in list(self.embed_jobs)]

    def prompt_tokens(
        self, prompt: str, context: list[int] | None = None, suffix: str | None = None
    ) -> list[int]:
        """A request's prompt as tokens: fill-in-the-middle, or ``context``
        (Ollama's generate) followed by the prompt."""
        if suffix is not None:
            tokens = self.fill_in_the_middle(prompt, suffix)
        else:
            tokens = self.tokenize(prompt, add_special=self.add_bos and not context)
        if context:
            if any(not 0 <= t < self.n_vocab for t in context):
                raise InputError("context contains a token id that is not in the vocabulary")
            tokens = list(context) + tokens
        return tokens or [llama_cpp.llama_vocab_bos(self.vocab)]

    def fit_prompt(self, tokens: list[int], num_keep: int, truncate: bool) -> list[int]:
        """``tokens`` within the context: truncated like Ollama's runner (the
        first ``num_keep`` and the end), or an ``InputError`` if not allowed."""
        head, tail = self._truncation(len(tokens), num_keep, truncate, ())
        return tokens[:head] + tokens[tail:]

    def _truncation(
        self, n_tokens: int, num_keep: int, truncate: bool, spans: Iterable[Span]
    ) -> Span:
        if n_tokens < self.n_ctx:
            return n_tokens, n_tokens
        if not truncate:
            raise InputError(
                f"the prompt ({n_tokens} tokens) does not fit the context length "
                f"({self.n_ctx}); shorten it, raise num_ctx, or allow truncate"
            )
        return truncation(n_tokens, self.n_ctx, num_keep, list(spans))

    # -- images ----------------------------------------------------------------------
    @property
    def image_marker(self) -> str:
        """The text that places an image in a plain prompt (mtmd's marker)."""
        return self._vision().marker

    def _vision(self) -> Vision:
        if self.vision is None:
            raise InputError("this model cannot take images: it was loaded without a projector")
        return self.vision

    def image_prompt(self, parts: list[Part], context: list[int] | None = None) -> ImagePrompt:
        """A prompt of text and images (file bytes) as tokens and image
        chunks, after Ollama's ``context`` if given. It must end with text:
        the answer starts from the logits of its last token."""
        if context and any(not 0 <= t < self.n_vocab for t in context):
            raise InputError("context contains a token id that is not in the vocabulary")
        vision = self._vision()
        prompt = vision.tokenize(parts, self.add_bos and not context, self.n_batch)
        if context:
            prompt.tokens[:0] = context
            prompt.images = {s + len(context): im for s, im in prompt.images.items()}
        if not prompt.tokens or any(e == len(prompt.tokens) for _, e in prompt.spans()):
            prompt.close()
            raise InputError("a prompt may not end with an image: put text after it")
        return prompt

    def fit_image_prompt(self, prompt: ImagePrompt, num_keep: int, truncate: bool) -> ImagePrompt:
        """``prompt`` within the context as ``fit_prompt``, an image that a
        cut would split dropped whole."""
        try:
            head, tail = self._truncation(len(prompt.tokens), num_keep, truncate, prompt.spans())
        except InputError:
            prompt.close()
            raise
        return prompt.cut(head, tail)

    def fits(self, text: str) -> bool:
        """Does a rendered prompt leave room in the context for an answer?"""
        return len(self.tokenize(text, add_special=self.add_bos)) < self.n_ctx

    def submit(self, job: Job) -> None:
        """Queue ``job``; it takes the best idle slot as soon as there is one.
        Its options and grammar are checked here, so a bad request fails at
        once without touching the others."""
        if len(job.tokens) >= self.n_ctx:  # fit_prompt first
            raise InputError(
                f"the prompt ({len(job.tokens)} tokens) does not fit the context length "
                f"({self.n_ctx})"
            )
        opts = {**DEFAULT_SAMPLING, **{k: v for k, v in job.options.items() if v is not None}}
        try:  # llama.cpp allocates the penalty window per slot: at most the context
            opts["repeat_last_n"] = repeat_window(int(opts["repeat_last_n"]), self.n_ctx)
        except ValueError as e:
            raise InputError(str(e)) from None
        sampler = make_sampler(
            self.tokens, self.candidates, self.n_ctx, opts, job.grammar, job.triggers, job.preserve
        )
        try:
            seq = Sequence(job, opts, sampler)
        except Exception:
            sampler.free()
            raise
        if seq.limit == -2:  # fill the context, then stop (Ollama)
            seq.limit, job.shift = -1, False
        self.waiting.append(seq)
        self._assign()

    def complete(
        self,
        prompt: str,
        options: dict[str, Any],
        emit: Emit,
        cancelled: Cancelled,
        grammar: str | None = None,
        context: list[int] | None = None,
        suffix: str | None = None,
        images: list[bytes] | None = None,
    ) -> Completion:
        """One request, run to its end on its own (tests, benchmarks)."""
        done: list[Completion] = []
        errors: list[Exception] = []
        job = Job(
            rid=-1,
            tokens=[],
            options=options,
            emit=emit,
            finish=done.append,
            fail=errors.append,
            cancelled=cancelled,
            grammar=grammar,
        )
        if images:
            parts = split_plain(prompt, self.image_marker, images)
            media = self.fit_image_prompt(
                self.image_prompt(parts, context), num_keep(options), True
            )
            job.tokens, job.images, job.release = media.tokens, media.images, media.close
        else:
            tokens = self.prompt_tokens(prompt, context, suffix)
            job.tokens = self.fit_prompt(tokens, num_keep(options), truncate=True)
        self.submit(job)
        while not done and not errors:
            self.step()
        if errors:
            raise errors[0]
        return done[0]

    def _assign(self) -> None:
        """Give waiting jobs idle slots, each the one whose cache shares the
        longest prefix with its prompt; drop the rest of that cache."""
        while self.waiting:
            idle = [SlotView(s.index, s.cached, s.last_used) for s in self.slots if s.seq is None]
            if not idle:
                return
            seq = self.waiting.popleft()
            if seq.job.cancelled():
                self._finish_unstarted(seq)
                continue
            index, shared = choose_slot(idle, seq.job.tokens)
            slot = self.slots[index]
            # one token is always decoded again: its logits start the answer;
            # an image is reused whole or decoded again whole
            keep = min(shared, len(seq.job.tokens) - 1)
            for spans in (slot.images, seq.job.spans()):
                if (cut := inside(keep, spans)) is not None:
                    keep = cut[0]
            if keep and self.n_swa:
                pos_min = llama_cpp.llama_memory_seq_pos_min(self.memory, index)
                keep = swa_reusable(keep, pos_min, self.n_swa)
            if keep < len(slot.cached):
                if not llama_cpp.llama_memory_seq_rm(self.memory, index, keep, -1):
                    keep = 0
                if keep == 0:
                    llama_cpp.llama_memory_seq_rm(self.memory, index, -1, -1)
                slot.truncate(keep)
            seq.slot, seq.fed = index, keep
            slot.seq = seq

    def _finish_unstarted(self, seq: Sequence) -> None:
        seq.free()
        _report(seq, lambda: seq.job.finish(seq.result("cancel", 0)))

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Free the slot at once (its cache stays for a later prefix match),
        then report."""
        slot = self.slots[seq.slot]
        slot.seq = None
        slot.last_used = time.monotonic()
        seq.free()
        _report(seq, lambda: seq.job.finish(seq.result(reason, seq.fed)))
        self._assign()  # a waiting request takes the slot before the next step

    def _fail(self, seq: Sequence, error: Exception) -> None:
        slot = self.slots[seq.slot]
        slot.seq = None
        llama_cpp.llama_memory_seq_rm(self.memory, slot.index, -1, -1)
        slot.truncate(0)
        seq.free()
        _tell_failure(seq, error)

    def _drop(self, seq: Sequence, error: Exception) -> None:
        """``seq``'s own work (reading its output, sending it) raised: it ends
        with ``error``, its slot and KV cells freed; the others go on."""
        if seq.slot >= 0 and self.slots[seq.slot].seq is seq:
            self._fail(seq, error)
        else:  # already reported (``_report`` told it)
            print(f"runner: request {seq.job.rid} failed after its end: {error!r}", file=sys.stderr)

    def fail_all(self, error: Exception) -> None:
        """End every completion with ``error`` (the loop's last resort after
        a failure no sequence owns): slots and KV cells freed, nothing left
        half-done for the next step."""
        for slot in self.slots:
            if slot.seq is not None:
                self._fail(slot.seq, error)
        while self.waiting:
            seq = self.waiting.popleft()
            seq.free()
            _tell_failure(seq, error)

    def _shift(self, slot: Slot, num_keep: int) -> bool:
        """Make room in ``slot``'s sequence: keep its head and the most recent
        half of the rest (Ollama's context shift). False if this cache cannot.
        A shift never cuts through an image (``context_window.shift_span``):
        an image across the end of the kept head stays with the head, one
        across the end of the discarded half goes whole; where that leaves
        nothing to discard, the sequence ends with done_reason "length"."""
        if not self._can_shift:
            return False
        n_past = len(slot.cached)
        start, end = shift_span(n_past, num_keep, slot.images)
        if end <= start:
            return False
        if not llama_cpp.llama_memory_seq_rm(self.memory, slot.index, start, end):
            return False
        llama_cpp.llama_memory_seq_add(self.memory, slot.index, end, n_past, start - end)
        slot.remove(start, end)
        return True

    def _drop_idle_cache(self) -> bool:
        """Free the least recently used idle slot's cache; False if none has one."""
        idle = [s for s in self.slots if s.seq is None and s.cached]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.last_used)
        llama_cpp.llama_memory_seq_rm(self.memory, slot.index, -1, -1)
        slot.truncate(0)
        return True

    def step(self) -> None:
        """One ``llama_decode`` for every slot: the next token of each
        generating sequence, then prompt chunks in the room left (so a long
        prompt delays the streams by one chunk at most); then sample."""
        for slot in self.slots:
            seq = slot.seq
            if seq is not None and seq.job.cancelled():
                self._finish(seq, "cancel")
        for seq in [q for q in self.waiting if q.job.cancelled()]:
            self.waiting.remove(seq)
            self._finish_unstarted(seq)
        self._assign()
        generating = [s.seq for s in self.slots if s.seq is not None and s.seq.prompt_done]
        for seq in generating:
            slot = self.slots[seq.slot]
            if len(slot.cached) + 1 > self.n_ctx and not (
                seq.job.shift and self._shift(slot, seq.num_keep)
            ):
                self._finish(seq, "length")
        generating = [s.seq for s in self.slots if s.seq is not None and s.seq.prompt_done]
        prompting = sorted(
            (s.seq for s in self.slots if s.seq is not None and not s.seq.prompt_done),
            key=lambda q: q.started_ns,
        )
        if not generating and not prompting:
            return
        # room in the shared KV cache: idle caches go first, then the longest
        # generating sequence shifts (or, if it may not, ends)
        used = sum(len(s.cached) for s in self.slots)
        wanted = len(generating) + sum(len(q.job.tokens) - q.fed for q in prompting)
        while used + min(wanted, self.n_batch) > self.n_ctx and self._drop_idle_cache():
            used = sum(len(s.cached) for s in self.slots)
        while generating and used + len(generating) > self.n_ctx:
            seq = max(generating, key=lambda q: len(self.slots[q.slot].cached))
            if not (seq.job.shift and self._shift(self.slots[seq.slot], seq.num_keep)):
                self._finish(seq, "length")
                generating.remove(seq)
            used = sum(len(s.cached) for s in self.slots)
        if self._feed_image(prompting, used, len(generating)):
            prompting = [q for q in prompting if self.slots[q.slot].seq is q]
            used = sum(len(s.cached) for s in self.slots)
            fed_image = True
        else:
            fed_image = False
        room = max(0, min(self.n_batch, self.n_ctx - used) - len(generating))
        b = self.batch
        n = 0
        outputs: list[tuple[Sequence, int]] = []  # sequences sampled after this decode
        for seq in generating:
            slot = self.slots[seq.slot]
            b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = (
                seq.next_token,
                len(slot.cached),
                1,
                1,
            )
            b.seq_id[n][0] = seq.slot
            outputs.append((seq, n))
            n += 1
        fed: list[tuple[Sequence, int]] = []
        for seq in prompting:
            if room <= 0:
                break
            slot = self.slots[seq.slot]
            end = min(seq.fed + room, seq.job.next_image(seq.fed))
            chunk = seq.job.tokens[seq.fed : end]  # up to its next image
            if not chunk:
                continue
            pos0 = len(slot.cached)
            for i, token in enumerate(chunk):
                b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, pos0 + i, 1, 0
                b.seq_id[n][0] = seq.slot
                n += 1
            if seq.fed + len(chunk) == len(seq.job.tokens):
                b.logits[n - 1] = 1
                outputs.append((seq, n - 1))
            fed.append((seq, len(chunk)))
            room -= len(chunk)
        if n == 0 and fed_image:
            return
        if n == 0:  # prompts fill the shared cache: the newest gives way
            self._fail(
                prompting[-1],
                EngineError(
                    f"the context ({self.n_ctx} tokens, shared by {len(prompting)} prompts) "
                    "is full; raise num_ctx or lower num_parallel"
                ),
            )
            return
        b.n_tokens = n
        t0 = time.perf_counter_ns()
        rc = llama_cpp.llama_decode(self.ctx, b)
        elapsed = time.perf_counter_ns() - t0
        if rc != 0:
            error = EngineError(f"llama_decode failed with status {rc}")
            for seq in {id(q): q for q, _ in [*outputs, *fed]}.values():
                self._fail(seq, error)
            return
        self.beat()
        for seq in generating:
            self.slots[seq.slot].cached.append(seq.next_token)
        for seq, count in fed:
            slot = self.slots[seq.slot]
            slot.cached.extend(seq.job.tokens[seq.fed : seq.fed + count])
            seq.fed += count
            seq.prompt_ns += elapsed
        for seq, index in outputs:
            try:
                self._next_token(seq, index)
            except Exception as e:  # its output could not be read or sent: it alone ends
                self._drop(seq, e)

    def _next_token(self, seq: Sequence, index: int) -> None:
        """Sample ``seq``'s next token at batch position ``index`` and hand
        it on (stop strings, text, the request's readers), ending it there if
        it is done."""
        if not seq.generating_since:
            seq.generating_since = time.perf_counter_ns()
            if seq.limit == 0:
                self._finish(seq, "length")
                return
        token = seq.sampler.sample(self.ctx, index)
        eog = llama_cpp.llama_vocab_is_eog(self.vocab, token)
        if seq.job.logprobs >= 0 and not eog:
            seq.job.on_logprob(self._logprob(index, token, seq.job.logprobs))
        piece = b"" if eog else self._piece_bytes(token, token in seq.job.preserve)
        if not seq.accept(token, piece, eog):
            self._finish(seq, seq.reason)

    def _feed_image(self, prompting: list[Sequence], used: int, n_generating: int) -> bool:
        """Decode the next image of the oldest prompt that stands at one and
        has room for it; at most one per step. True if one went in (or failed
        its sequence)."""
        for seq in prompting:
            image = seq.job.images.get(seq.fed)
            if image is None or used + image.n_tokens + n_generating > self.n_ctx:
                continue
            slot = self.slots[seq.slot]
            pos = len(slot.cached)
            try:
                seq.prompt_ns += self._vision().decode(self.ctx, image, pos, seq.slot, self.n_batch)
            except EngineError as e:
                self._fail(seq, e)
                return True
            self.beat()
            slot.cached.extend(seq.job.tokens[seq.fed : seq.fed + image.n_tokens])
            slot.images.append(image.span(pos))
            seq.fed += image.n_tokens
            return True
        return False

    def _logprob(self, index: int, token: int, top: int) -> dict[str, Any]:
        """The model's log-probability of ``token`` at batch position ``index``
        (log-softmax of the raw logits, before any sampler), with the ``top``
        likeliest tokens: OpenAI's and Ollama's logprob entry."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float64)
        peak = logits.max()
        norm = peak + np.log(np.exp(logits - peak).sum())
        entry = self._token_entry(token, float(logits[token] - norm))
        alternatives: list[dict[str, Any]] = []
        if top > 0:
            best = np.argpartition(-logits, min(top, self.n_vocab - 1))[:top]
            best = best[np.argsort(-logits[best])]
            alternatives = [self._token_entry(int(t), float(logits[t] - norm)) for t in best]
        entry["top_logprobs"] = alternatives
        return entry

    def _token_entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self._piece_bytes(token, True)
        return {
            "token": raw.decode(errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }


def _report(seq: Sequence, report: Callable[[], None]) -> None:
    """Run ``seq``'s own reporting (its output readers, its replies): an
    exception there ends that request alone, with the error, never the loop."""
    try:
        report()
    except Exception as e:
        _tell_failure(seq, e)


def _tell_failure(seq: Sequence, error: Exception) -> None:
    try:
        seq.job.fail(error)
    except Exception as e:  # it cannot even be told: the loop goes on
        print(f"runner: request {seq.job.rid} could not be told {error!r}: {e!r}", file=sys.stderr)


@dataclass
class Slot:
    """One of the context's sequences: its cached tokens and current job."""

    index: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV entries it holds
    seq: Sequence | None = None
    last_used: float = 0.0
    images: list[Span] = field(default_factory=list)  # positions in ``cached`` that are images

    def truncate(self, keep: int) -> None:
        """Forget all but the first ``keep`` positions (never inside an image)."""
        del self.cached[keep:]
        self.images = [span for span in self.images if span[1] <= keep]

    def remove(self, start: int, end: int) -> None:
        """Forget the positions ``[start, end)``; those after move down."""
        del self.cached[start:end]
        n = end - start
        self.images = [
            (s, e) if e <= start else (s - n, e - n)
            for s, e in self.images
            if e <= start or s >= end
        ]
