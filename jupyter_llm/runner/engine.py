"""The runner's engine: one model, one context, decoding with llama.cpp's C API.

The high-level ``llama_cpp.Llama`` spends Python time per token (score copies,
bookkeeping). Here the hot loop is: native sampler chain -> one reused
``llama_batch`` -> ``llama_decode``, plus an incremental UTF-8 decoder.
Runs in the runner process only; everything here blocks.
"""

from __future__ import annotations

import codecs
import ctypes
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from jupyter_llm.memory.measured import AllocationLog
from jupyter_llm.runner.chat_template import ChatTemplate
from jupyter_llm.runner.pooling import (
    POOLING_NAMES,
    embedding_pooling,
    finish_vector,
    fit_tokens,
    legacy_normalizes,
)
from jupyter_llm.runner.protocol import EngineError, InputError

Emit = Callable[[str], None]
Cancelled = Callable[[], bool]

# Ollama's defaults (api.DefaultOptions) for what the client leaves out.
DEFAULT_SAMPLING: dict[str, Any] = {
    "num_predict": -1,
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "repeat_penalty": 1.1,
    "repeat_last_n": 64,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "seed": -1,
    "stop": [],
    "typical_p": 1.0,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
}
DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


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


@dataclass
class Completion:
    """What a finished request reports (durations in nanoseconds)."""

    done_reason: str = "stop"
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    context: list[int] = field(default_factory=list)


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


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_to_stderr, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


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
        self.n_batch = max(1, min(params.n_batch, n_ctx))
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = self.n_batch
        cp.n_ubatch = self.n_batch
        cp.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if params.flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
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
        self.cached: list[int] = []  # tokens whose KV entries are in sequence 0
        self._logits_ready = False  # do the current logits belong to cached[-1]?
        self._piece = ctypes.create_string_buffer(256)
        self.chat_template = self.metadata("tokenizer.chat_template")
        self._chat: ChatTemplate | None = None
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._n_threads = params.n_threads if params.n_threads > 0 else cp.n_threads
        self._embed_ctx: Any = None
        self._embed_batch: Any = None
        self.beat: Callable[[], None] = lambda: None  # progress between decode steps

    def close(self) -> None:
        if self._embed_ctx:
            llama_cpp.llama_batch_free(self._embed_batch)
            llama_cpp.llama_free(self._embed_ctx)
            self._embed_ctx = None
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
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            return buf.raw[:n]
        return self._piece.raw[:n]

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode()
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
    def render_chat(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
        """The model's chat template (Jinja2, as transformers renders it), with
        its work bounded (``chat_template``: a hostile template is a 400)."""
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
        return self._chat.render(messages, tools)

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

    def _embedding_context(self, pooling: int) -> Any:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.n_ctx
        cp.embeddings = True
        cp.pooling_type = pooling
        cp.n_threads, cp.n_threads_batch = self._n_threads, self._n_threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not ctx:
            raise EngineError("failed to create the embedding context (out of memory?)")
        return ctx

    def _open_embedding(self) -> None:
        """The second context (created on first use, sharing the model's
        weights), pooled as the model declares (``pooling.embedding_pooling``)."""
        ctx = self._embedding_context(llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
        declared = llama_cpp.llama_pooling_type(ctx)
        try:
            pooling = embedding_pooling(declared)
        except InputError:
            llama_cpp.llama_free(ctx)
            raise
        if pooling != declared:
            llama_cpp.llama_free(ctx)
            ctx = self._embedding_context(pooling)
        self._embed_ctx = ctx
        self._embed_batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)
        name = POOLING_NAMES.get(pooling, str(pooling))
        declares = POOLING_NAMES.get(declared, "none")
        sys.stderr.write(f"embeddings pool by {name} (the model declares {declares})\n")

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

    def embed(
        self,
        texts: list[str],
        truncate: bool,
        dimensions: int | None,
        normalize: bool | None,
        emit: Callable[[list[float]], None],
        cancelled: Cancelled = lambda: False,
    ) -> int:
        """Embeddings pooled as the model declares (``runner.pooling``). Each
        vector goes to ``emit`` as soon as it is made, so a batch of any size
        is never held whole; returns the tokens counted. ``normalize`` None:
        as Ollama's legacy route does for this model. ``EngineError`` if
        ``cancelled`` between two inputs."""
        if self._embed_ctx is None:
            self._open_embedding()
        if normalize is None:
            normalize = self.legacy_normalizes()
        n_embd = self.n_embd
        # At most the context, and at most what the model was trained on
        # (llama.cpp rounds a context up; a bert model has no positions past it).
        limit = min(self.n_ctx, self.n_ctx_train or self.n_ctx)
        memory = llama_cpp.llama_get_memory(self._embed_ctx)
        counted = 0
        for text in texts:
            if cancelled():
                raise EngineError("cancelled")
            tokens = self.tokenize(text, add_special=True, parse_special=False) or [
                llama_cpp.llama_vocab_bos(self.vocab)
            ]
            if len(tokens) > limit:
                if not truncate:
                    raise InputError(
                        f"input length ({len(tokens)} tokens) exceeds the context length ({limit})"
                    )
                plain = self.tokenize(text, add_special=False, parse_special=False)
                tokens = fit_tokens(tokens, plain, limit)
            counted += len(tokens)
            if memory:
                llama_cpp.llama_memory_clear(memory, True)
            b = self._embed_batch
            for i, token in enumerate(tokens):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, i, 1, 1
                b.seq_id[i][0] = 0
            b.n_tokens = len(tokens)
            if llama_cpp.llama_decode(self._embed_ctx, b) != 0:
                raise EngineError("llama_decode failed while embedding")
            self.beat()
            pointer = llama_cpp.llama_get_embeddings_seq(self._embed_ctx, 0)
            if not pointer:
                raise EngineError("the model produced no embedding")
            emit(finish_vector(list(pointer[:n_embd]), dimensions, normalize))
        return counted

    # -- decoding --------------------------------------------------------------------
    def _evaluate(self, tokens: list[int], cancelled: Cancelled = lambda: False) -> bool:
        """Decode ``tokens`` after the cached ones; logits only for the last.
        ``cancelled`` is checked before every chunk, so a client that leaves
        during a long prompt frees the runner within one chunk; False if it did."""
        b = self.batch
        for start in range(0, len(tokens), self.n_batch):
            if cancelled():
                return False
            chunk = tokens[start : start + self.n_batch]
            pos0 = len(self.cached)
            for i, token in enumerate(chunk):
                b.token[i] = token
                b.pos[i] = pos0 + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 0
            b.logits[len(chunk) - 1] = 1
            b.n_tokens = len(chunk)
            rc = llama_cpp.llama_decode(self.ctx, b)
            if rc != 0:
                raise EngineError(f"llama_decode failed with status {rc}")
            self.cached.extend(chunk)
            self.beat()
        return True

    def _prepare_prompt(self, tokens: list[int], cancelled: Cancelled = lambda: False) -> bool:
        """Evaluate what the cache does not already hold, reusing the longest
        cached prefix. When the whole prompt is cached and the last decode left
        its logits, nothing is evaluated at all. False if cancelled part-way
        (the cache then holds the chunks evaluated so far, without logits)."""
        common = 0
        for a, b in zip(self.cached, tokens, strict=False):
            if a != b:
                break
            common += 1
        if common == len(tokens) == len(self.cached) and self._logits_ready:
            return True
        common = min(common, len(tokens) - 1)  # re-evaluate one token for fresh logits
        if common < len(self.cached):
            if not llama_cpp.llama_memory_seq_rm(self.memory, 0, common, -1):
                llama_cpp.llama_memory_clear(self.memory, True)
                common = 0
            del self.cached[common:]
        self._logits_ready = False
        if not self._evaluate(tokens[common:], cancelled):
            return False
        self._logits_ready = True
        return True

    def _sampler(self, opts: dict[str, Any], grammar: str | None) -> Any:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if grammar:
            g = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
            if not g:
                llama_cpp.llama_sampler_free(chain)
                raise EngineError("invalid grammar")
            add(chain, g)
        repeat, freq, presence = (
            float(opts["repeat_penalty"]),
            float(opts["frequency_penalty"]),
            float(opts["presence_penalty"]),
        )
        if repeat != 1.0 or freq != 0.0 or presence != 0.0:
            last_n = int(opts["repeat_last_n"])
            last_n = self.n_ctx if last_n == -1 else last_n
            add(
                chain,
                llama_cpp.llama_sampler_init_penalties(
                    self.n_vocab, last_n, repeat, freq, presence
                ),
            )
        temperature = float(opts["temperature"])
        if temperature <= 0:
            add(chain, llama_cpp.llama_sampler_init_greedy())
            return chain
        seed = int(opts["seed"])
        seed = seed if seed >= 0 else DEFAULT_SEED
        mirostat = int(opts["mirostat"])
        if mirostat in (1, 2):  # mirostat replaces top-k/top-p/typical sampling
            tau, eta = float(opts["mirostat_tau"]), float(opts["mirostat_eta"])
            add(chain, llama_cpp.llama_sampler_init_temp(temperature))
            if mirostat == 1:
                add(chain, llama_cpp.llama_sampler_init_mirostat(self.n_vocab, seed, tau, eta, 100))
            else:
                add(chain, llama_cpp.llama_sampler_init_mirostat_v2(seed, tau, eta))
            return chain
        if int(opts["top_k"]) > 0:
            add(chain, llama_cpp.llama_sampler_init_top_k(int(opts["top_k"])))
        if float(opts["top_p"]) < 1.0:
            add(chain, llama_cpp.llama_sampler_init_top_p(float(opts["top_p"]), 1))
        if float(opts["typical_p"]) < 1.0:
            add(chain, llama_cpp.llama_sampler_init_typical(float(opts["typical_p"]), 1))
        if float(opts["min_p"]) > 0.0:
            add(chain, llama_cpp.llama_sampler_init_min_p(float(opts["min_p"]), 1))
        add(chain, llama_cpp.llama_sampler_init_temp(temperature))
        add(chain, llama_cpp.llama_sampler_init_dist(seed))
        return chain

    def complete(
        self,
        prompt: str,
        options: dict[str, Any],
        emit: Emit,
        cancelled: Cancelled,
        grammar: str | None = None,
        context: list[int] | None = None,
        suffix: str | None = None,
    ) -> Completion:
        opts = {**DEFAULT_SAMPLING, **{k: v for k, v in options.items() if v is not None}}
        stops = [opts["stop"]] if isinstance(opts["stop"], str) else list(opts["stop"] or [])
        if suffix is not None:
            tokens = self.fill_in_the_middle(prompt, suffix)
        else:
            tokens = self.tokenize(prompt, add_special=self.add_bos and not context)
        if context:
            if any(not 0 <= t < self.n_vocab for t in context):
                raise InputError("context contains a token id that is not in the vocabulary")
            tokens = list(context) + tokens
        if not tokens:
            tokens = [llama_cpp.llama_vocab_bos(self.vocab)]
        limit = int(opts["num_predict"])
        if len(tokens) >= self.n_ctx:  # keep the end of an over-long prompt, like Ollama
            tokens = tokens[-(self.n_ctx // 2) :]
        result = Completion(prompt_eval_count=len(tokens))

        t0 = time.perf_counter_ns()
        evaluated = self._prepare_prompt(tokens, cancelled)
        t1 = time.perf_counter_ns()
        result.prompt_eval_duration = t1 - t0
        if not evaluated:  # the client left during the prompt: report what was done
            result.done_reason = "cancel"
            result.prompt_eval_count = len(self.cached)
            result.context = list(self.cached)
            return result

        chain = self._sampler(opts, grammar)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        generated: list[int] = []
        sample, is_eog, piece = (
            llama_cpp.llama_sampler_sample,
            llama_cpp.llama_vocab_is_eog,
            self._piece_bytes,
        )
        b = self.batch
        reason = "length"
        try:
            while limit < 0 or len(generated) < limit:
                if cancelled():
                    reason = "cancel"
                    break
                token = sample(chain, self.ctx, -1)
                if is_eog(self.vocab, token):
                    reason = "stop"
                    break
                generated.append(token)
                text = decoder.decode(piece(token))
                if text:
                    if stops:
                        pending += text
                        text, hit = split_at_stop(pending, stops)
                        pending = pending[len(text) :]
                        if text:
                            emit(text)
                        if hit:
                            reason = "stop"
                            break
                    else:
                        emit(text)
                if len(generated) == limit or len(self.cached) >= self.n_ctx:
                    break
                # one-token decode through the reused batch: the hot path
                b.token[0] = token
                b.pos[0] = len(self.cached)
                b.n_seq_id[0] = 1
                b.seq_id[0][0] = 0
                b.logits[0] = 1
                b.n_tokens = 1
                self._logits_ready = False
                if llama_cpp.llama_decode(self.ctx, b) != 0:
                    raise EngineError("llama_decode failed while generating")
                self.beat()
                self.cached.append(token)
                self._logits_ready = True
        finally:
            llama_cpp.llama_sampler_free(chain)
        tail = pending + decoder.decode(b"", final=True)
        if tail and reason != "stop":
            emit(tail)
        result.done_reason = reason
        result.eval_count = len(generated)
        result.eval_duration = time.perf_counter_ns() - t1
        result.context = tokens + generated
        return result


def split_at_stop(pending: str, stops: list[str]) -> tuple[str, bool]:
    """How much of ``pending`` may be emitted now, and whether a stop was hit.

    Text that could still become a stop sequence is held back.
    """
    first = min((i for s in stops if s and (i := pending.find(s)) >= 0), default=-1)
    if first >= 0:
        return pending[:first], True
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(pending)), 0, -1):
            if pending.endswith(s[:k]):
                hold = max(hold, k)
                break
    return pending[: len(pending) - hold], False
