"""The batch loop: one context over the model's weights holding ``n_seq``
sequences, decoding with llama.cpp's C API (continuous batching).

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
take turns between decode steps within their share of the loop, in their
own context (``runner.embedding_context``). The model, its vocabulary and
its templates are ``runner.model``.
Runs in the runner process only; everything here blocks.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import llama_cpp

from jupyter_llm.memory.layout import CPU
from jupyter_llm.memory.measured import Sizes, merged
from jupyter_llm.memory.outputs import output_rows
from jupyter_llm.request.limits import PREDICT_CONTEXTS, repeat_window
from jupyter_llm.request.options import DEFAULT_SAMPLING  # Ollama's api.DefaultOptions
from jupyter_llm.request.priority import BATCH, decode_slots, seq_ids
from jupyter_llm.runner.constrained import Candidates
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
from jupyter_llm.runner.cpu_threads import (
    idle_jiffies,
    own_cpu_seconds,
    own_cpus,
    run_queue_wait,
)
from jupyter_llm.runner.draft_model import close_draft, open_draft
from jupyter_llm.runner.embedding_context import EmbeddingContext
from jupyter_llm.runner.interrupt import ABORTED, StepInterrupt
from jupyter_llm.runner.kv_cache import cache_types, open_context
from jupyter_llm.runner.logprobs import Logprobs
from jupyter_llm.runner.model import Model
from jupyter_llm.runner.pausing import Pauses, prompt_order
from jupyter_llm.runner.prompt_disk import open_disk
from jupyter_llm.runner.prompt_ram import open_ram, save, swap
from jupyter_llm.runner.protocol import Done, EngineError, InputError, LoadParams
from jupyter_llm.runner.sequence import Job, Sequence, make_sampler
from jupyter_llm.runner.slot import Slot
from jupyter_llm.runner.speculative import add_draft, next_tokens, prepare_drafts
from jupyter_llm.runner.step_costs import StepCosts, StepShape
from jupyter_llm.runner.thread_tuning import CpuWatch, ThreadTuner
from jupyter_llm.runner.vision import ImagePrompt, split_plain

Emit = Callable[[str], None]
Cancelled = Callable[[], bool]


# characters per context token below which a text is simply tokenized, without
# asking the vocabulary for its longest token: prose holds about 4 a token
SHORTEST_LONG = 8
FLASH_ATTN_TYPES = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# a temperature below this samples as greedy does: the chain divides float32
# logits by it, and far below (1e-45) they overflow to NaN probabilities
GREEDY_BELOW = 1e-5


def context_params(params: LoadParams, n_ctx_train: int) -> Any:
    """llama.cpp's parameters for the batch loop's context: ``n_seq``
    sequences sharing ``n_ctx`` cells (at most what the model was trained
    on), and a batch that holds every generating sequence's token."""
    n_seq = decode_slots(params.n_seq)
    # at least a cell per slot: llama.cpp holds n_batch to the n_ctx asked for,
    # and a step of every slot's token past n_batch aborts the process
    n_ctx = max(16, n_seq, min(params.n_ctx, n_ctx_train or params.n_ctx))
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    # every generating sequence's token fits in a step beside a prompt chunk
    cp.n_batch = cp.n_ubatch = max(1, n_seq, min(params.n_batch, n_ctx))
    cp.n_seq_max = seq_ids(n_seq)  # and spare ids for paused batch sequences (pausing)
    cp.n_outputs_max = output_rows(cp.n_batch, n_seq, cp.n_seq_max)  # a step's logit rows
    cp.kv_unified = True
    # windowed layers keep only their window (as llama-server and Ollama);
    # a cached prefix is then reusable only while its window is still held
    cp.swa_full = False
    # llama.cpp's default (auto: on where the backend has it), as
    # llama-server; about 5 % more tokens/s with 4 streams on the CPU
    cp.flash_attn_type = FLASH_ATTN_TYPES[params.flash_attn]
    if params.batch_invariant and params.flash_attn == "auto":
        # the per-row path is flash attention's, and llama.cpp's auto turns it
        # on for a quantized V cache only, not for q8_0 keys
        cp.flash_attn_type = FLASH_ATTN_TYPES["on"]
    cp.type_k, cp.type_v = cache_types(params)  # f16, q8_0 or q4_0 (runner/kv_cache.py)
    if params.n_threads > 0:
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads
    return cp


def thread_tuner(params: LoadParams) -> ThreadTuner | None:
    """The thread count's tuner (``runner.thread_tuning``) where the count
    is the default and every layer is on the CPU (a GPU's layers do not wait
    on CPU threads); None where it stays as it is."""
    if not params.adapt_threads or params.n_gpu_layers != 0 or params.n_threads < 2:
        return None
    cpus = own_cpus()
    watch = CpuWatch(cpus, idle_jiffies, own_cpu_seconds, run_queue_wait) if cpus else None
    return ThreadTuner(params.n_threads, cpu=watch)


class Engine:
    """The continuous-batching loop over one context; see the module docstring."""

    def __init__(self, params: LoadParams, progress: Callable[[float], None] | None = None) -> None:
        self.model = model = Model(params, progress)
        cp = context_params(params, model.n_ctx_train)
        self.n_seq, self.n_batch = decode_slots(params.n_seq), cp.n_batch
        self.n_outputs = cp.n_outputs_max  # rows of logits a step may ask for (memory.outputs)
        self.ctx, self.kv_fallback = open_context(model.llama_model, cp, params)  # f16 if refused
        if not self.ctx:
            model.close()
            raise EngineError("failed to create the llama context (out of memory?)")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        if llama_cpp.llama_n_batch(self.ctx) < self.n_batch:  # a step would abort llama.cpp
            llama_cpp.llama_free(self.ctx)
            model.close()
            raise EngineError(f"llama.cpp made a batch smaller than {self.n_batch} tokens")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._can_shift = bool(llama_cpp.llama_memory_can_shift(self.memory))
        self.vocab, self._piece_bytes = model.vocab, model.piece  # read once per token
        self.candidates = Candidates(model.n_vocab)  # shared: sequences sample one by one
        self.logprobs = Logprobs(self.ctx, model.n_vocab, model.piece)
        self.slots = [Slot(i) for i in range(cp.n_seq_max)]  # n_seq decode at once
        self.pauses = Pauses(self.memory)  # pauses drop cells where the context is full
        # interactive arrivals cut batch-only steps (not where no step is taken back)
        self.interrupt = StepInterrupt(self.ctx, rolls_back=not model.recurrent)
        # an encoder (BERT: no cache; T5: a decoder that needs llama_encode) embeds only
        self.generates = bool(self.memory) and not llama_cpp.llama_model_has_encoder(
            model.llama_model
        )
        self.disk = open_disk(params.prompt_disk)  # long prefixes kept on disk
        self.ram = open_ram(params.prompt_ram)  # and in RAM while the runner lives
        self.waiting: deque[Sequence] = deque()
        n_threads = params.n_threads if params.n_threads > 0 else cp.n_threads
        self.embeddings = EmbeddingContext(model, self.n_ctx, n_threads)
        self.beat: Callable[[], None] = lambda: None  # progress between decode steps
        self.drafter = open_draft(self, params)  # a draft model (runner.draft_model), or None
        self.step_costs = StepCosts(self.n_seq, self.n_batch)  # what a drafted token costs here
        self.shape = StepShape()  # the step being filled and sampled (runner.step_costs)
        self.invariant = params.batch_invariant  # drafts only alone (runner.speculative)
        self.threads = thread_tuner(params)  # fewer threads while others hold cores, or None
        if params.projector:
            try:  # on the GPU where the model's layers are
                model.open_projector(params.projector, n_threads, params.n_gpu_layers != 0)
            except EngineError:
                self.close()
                raise

    def close(self) -> None:
        if self.ctx:
            close_draft(self)
            self.embeddings.close()
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
            self.model.close()

    # -- the loop's state --------------------------------------------------------------
    def held_beyond_load(self) -> Sizes:
        """What the runner holds that its load did not report: the embeddings'
        context once made (about 140 MiB on Gemma), and the prompts kept in RAM
        (up to ``prompt_ram_cache``)."""
        ram = self.ram.bytes if self.ram is not None else 0
        return merged(self.embeddings.allocations, {CPU: {"kv_cache": ram}} if ram else {})

    @property
    def busy(self) -> bool:
        """Anything to decode, waiting for a slot, or to embed?"""
        return self.streaming or bool(self.embeddings.jobs)

    @property
    def streaming(self) -> bool:
        """Any completion decoding or waiting for a slot?"""
        return bool(self.waiting) or any(s.seq is not None for s in self.slots)

    @property
    def active_ids(self) -> list[int]:
        """Request ids in slots, waiting, or embedding (read by the health thread)."""
        ids = [s.seq.job.rid for s in list(self.slots) if s.seq is not None]
        ids += [q.job.rid for q in list(self.waiting)]
        return ids + [j.rid for j in list(self.embeddings.jobs)]

    def embed_turn(self, step_seconds: float | None) -> None:
        """After a decode step of the completions (``step_seconds`` long; None
        when none ran), the embeddings' turn within their share of the loop."""
        if self.embeddings.turn(step_seconds, self.streaming):
            self.beat()

    # -- prompts in this context -------------------------------------------------------
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
        """Does a rendered prompt leave room in the context for an answer? A
        text surely too long is not tokenized (megabytes take seconds of the
        loop every stream waits on)."""
        if self.surely_too_long(text):
            return False
        return len(self.model.tokenize(text, add_special=self.model.add_bos)) < self.n_ctx

    def surely_too_long(self, text: str, tokens: int | None = None) -> bool:
        """Is ``text`` more than ``tokens`` (the context) tokens, whatever its
        words? Each token holds at most ``longest`` characters."""
        tokens = self.n_ctx if tokens is None else tokens
        return len(text) > tokens * SHORTEST_LONG and len(text) >= tokens * self.longest_token

    @functools.cached_property
    def longest_token(self) -> int:
        return self.model.tokens.longest()

    def prompt_tokens(
        self, prompt: str, context: list[int] | None, suffix: str | None, truncate: bool
    ) -> list[int]:
        """``Model.prompt_tokens``, less the middle of a prompt surely too long
        for the context: truncation keeps its head and its end, so only as
        much of each as the context could hold is tokenized (a 32 MiB prompt
        took seconds of the loop). Refused at once where it may not be cut."""
        if suffix is not None or not self.surely_too_long(prompt, 2 * self.n_ctx):
            return self.model.prompt_tokens(prompt, context, suffix)
        if not truncate:
            raise InputError(
                f"the prompt (over {len(prompt) // self.longest_token:,} tokens) does not fit "
                f"the context length ({self.n_ctx}); shorten it, raise num_ctx, or allow truncate"
            )
        span = self.n_ctx * self.longest_token  # characters holding at least n_ctx tokens
        head = self.model.prompt_tokens(prompt[:span], context, None)
        tail = self.model.tokenize(prompt[-span:], add_special=False)
        return head + tail  # the cut falls in what truncation drops

    # -- requests ----------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job``; it takes the best idle slot as soon as there is one.
        Its options and grammar are checked here, so a bad request fails at
        once without touching the others."""
        if not self.generates:  # llama.cpp would abort the runner on its first decode
            raise InputError("this model only embeds (it has an encoder): use /api/embed")
        if len(job.tokens) >= self.n_ctx:  # fit_prompt first
            raise InputError(
                f"the prompt ({len(job.tokens)} tokens) does not fit the context length "
                f"({self.n_ctx})"
            )
        opts = {**DEFAULT_SAMPLING, **{k: v for k, v in job.options.items() if v is not None}}
        if float(opts["temperature"]) < GREEDY_BELOW:  # 1e-45 made every logit infinite (NaN)
            opts["temperature"] = 0.0
        try:  # llama.cpp allocates the penalty window per slot: at most the context
            opts["repeat_last_n"] = repeat_window(int(opts["repeat_last_n"]), self.n_ctx)
        except ValueError as e:
            raise InputError(str(e)) from None
        sampler = make_sampler(
            self.model.tokens,
            self.candidates,
            self.n_ctx,
            opts,
            job.grammar,
            job.triggers,
            job.preserve,
        )
        try:
            seq = Sequence(job, opts, sampler)
        except Exception:
            sampler.free()
            raise
        if seq.limit == -2:  # fill the context, then stop (Ollama)
            seq.limit, job.shift = -1, False
        longest = PREDICT_CONTEXTS.value * self.n_ctx  # shifting, a model that never stops
        if seq.limit < 0 or seq.limit > longest:  # would have no end (Ollama's bound)
            seq.limit = longest
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
    ) -> Done:
        """One request, run to its end on its own (tests, benchmarks)."""
        done: list[Done] = []
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
            parts = split_plain(prompt, self.model.image_marker, images)
            media = self.model.image_prompt(parts, context, self.n_batch)
            media = self.fit_image_prompt(media, num_keep(options), True)
            job.tokens, job.images, job.release = media.tokens, media.images, media.close
        else:
            tokens = self.model.prompt_tokens(prompt, context, suffix)
            job.tokens = self.fit_prompt(tokens, num_keep(options), truncate=True)
        self.submit(job)
        while not done and not errors:
            self.step()
        if errors:
            raise errors[0]
        return done[0]

    # -- slots -------------------------------------------------------------------------
    def _assign(self) -> None:
        """Give waiting jobs idle slots, each the one whose cache shares the
        longest prefix with its prompt; drop the rest of that cache. Who
        starts, pauses or resumes is ``runner.pausing``'s call."""
        while move := self.pauses.next_move(self.slots, self.waiting, self.n_seq, self.n_ctx):
            if move.resume is not None or move.pause is not None:
                self.pauses.turn(self.slots, move)
            if move.start is None:
                continue
            seq = self.waiting[move.start]
            del self.waiting[move.start]
            if seq.job.cancelled():
                self._finish_unstarted(seq)
                continue
            idle = [SlotView(s.index, s.cached, s.last_used) for s in self.slots if s.seq is None]
            index, shared = choose_slot(idle, seq.job.tokens)
            slot = self.slots[index]
            keep = self._reusable(slot, seq, shared)
            keep, seq.prompt_cache = swap(self, slot, seq.job.tokens, keep)  # or from RAM/disk
            if keep < len(slot.cached):
                if not llama_cpp.llama_memory_seq_rm(self.memory, index, keep, -1):
                    keep = 0
                if keep == 0:
                    llama_cpp.llama_memory_seq_rm(self.memory, index, -1, -1)
                slot.truncate(keep)
            seq.slot, seq.fed, seq.reused = index, keep, keep
            slot.seq = seq
            self.pauses.started(slot)

    def _reusable(self, slot: Slot, seq: Sequence, shared: int) -> int:
        """How much of ``slot``'s cache ``seq`` reuses of the ``shared``
        prefix. One token is always decoded again: its logits start the
        answer; an image is reused whole or decoded again whole."""
        keep = min(shared, len(seq.job.tokens) - 1)
        for spans in (slot.images, seq.job.spans()):
            if (cut := inside(keep, spans)) is not None:
                keep = cut[0]
        if keep and self.model.n_swa:
            pos_min = llama_cpp.llama_memory_seq_pos_min(self.memory, slot.index)
            keep = swa_reusable(keep, pos_min, self.model.n_swa)
        return keep

    @property
    def decode_threads(self) -> int:
        """The CPU threads decoding runs with: the tuner's settled count
        where it tunes (a probe's steps aside), else the context's."""
        if self.threads is not None:
            return self.threads.count
        return int(llama_cpp.llama_n_threads(self.ctx))

    def _finish_unstarted(self, seq: Sequence) -> None:
        seq.free()
        _report(seq, lambda: seq.job.finish(seq.result("cancel", 0, self.decode_threads)))

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Free the slot at once (its cache stays for a later prefix match),
        then report."""
        slot = self.slots[seq.slot]
        slot.seq = None
        slot.last_used = time.monotonic()
        seq.free()
        _report(seq, lambda: seq.job.finish(seq.result(reason, seq.fed, self.decode_threads)))
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
        save(self, slot)  # kept in RAM (runner.prompt_ram)
        llama_cpp.llama_memory_seq_rm(self.memory, slot.index, -1, -1)
        slot.truncate(0)
        return True

    # -- one step, in phases -------------------------------------------------------------
    def step(self) -> None:
        """One ``llama_decode`` for every slot: the next token of each
        generating sequence, then prompt chunks in the room left (so a long
        prompt delays the streams by one chunk at most); then sample. Its
        phases: cancel, make room, images, fill the batch, decode, sample."""
        self._cancel()
        self._assign()
        self._make_room_in_sequences()
        self.pauses.before_step(self)  # cells dropped for a pause, or decoded again
        running = self.pauses.this_step([s.seq for s in self.slots if s.seq and not s.paused])
        generating = [q for q in running if q.prompt_done]
        prompting = sorted((q for q in running if not q.prompt_done), key=prompt_order)
        if not generating and not prompting:
            return
        used = self._make_room_in_cache(generating, prompting)
        fed_image = self._feed_image(prompting, used, len(generating))
        if fed_image:
            prompting = [q for q in prompting if self.slots[q.slot].seq is q]
            used = sum(len(s.cached) for s in self.slots)
        room = max(0, min(self.n_batch, self.n_ctx - used) - len(generating))
        outputs: list[tuple[Sequence, int]] = []  # sequences sampled after this decode
        fed: list[tuple[Sequence, int]] = []  # prompt chunks: their sequence and length
        self.shape = StepShape(len(generating), bool(prompting))  # what drafts are priced by
        drafting_ns = prepare_drafts(self, generating, room)  # a draft model's, all at once
        n = self._fill_batch(generating, prompting, room, outputs, fed)
        if n == 0:
            if not fed_image:
                self._context_full(prompting)
            return
        elapsed = self._decode(n, outputs, fed)
        if elapsed is None:
            return
        self._cache_decoded(generating, fed, elapsed)
        t0 = time.perf_counter_ns()
        self._sample(outputs)
        if not fed:  # generating sequences alone: what the step cost (runner.step_costs)
            elapsed += drafting_ns + time.perf_counter_ns() - t0
            if self.threads is None or self.threads.threads == self.threads.count:
                self.step_costs.observe(len(generating), n, elapsed)  # not another count's
            if self.threads is not None:
                settled = self.threads.count
                self._set_threads(self.threads.observe(len(generating), n, elapsed))
                if self.threads.count != settled:  # what a draft costs is measured anew
                    self.step_costs = StepCosts(self.n_seq, self.n_batch, self.step_costs.pinned)
                    print(  # the server logs it with --debug
                        f"runner: decoding with {self.threads.count} of"
                        f" {self.threads.maximum} threads (was {settled})",
                        file=sys.stderr,
                    )

    def _set_threads(self, count: int) -> None:
        """Decode at ``count`` threads from the next step on (``runner.thread_tuning``)."""
        if count != llama_cpp.llama_n_threads(self.ctx):
            llama_cpp.llama_set_n_threads(self.ctx, count, count)

    def _cancel(self) -> None:
        """End the cancelled requests, in slots and waiting."""
        for slot in self.slots:
            seq = slot.seq
            if seq is not None and seq.job.cancelled():
                self._finish(seq, "cancel")
        for seq in [q for q in self.waiting if q.job.cancelled()]:
            self.waiting.remove(seq)
            self._finish_unstarted(seq)

    def _make_room_in_sequences(self) -> None:
        """A generating sequence at the end of the context shifts, or (where
        it may not or cannot) ends with "length"."""
        generating = [s.seq for s in self.slots if s.seq and s.seq.prompt_done and not s.paused]
        for seq in generating:
            slot = self.slots[seq.slot]
            if len(slot.cached) + 1 > self.n_ctx and not (
                seq.job.shift and self._shift(slot, seq.num_keep)
            ):
                self._finish(seq, "length")

    def _make_room_in_cache(self, generating: list[Sequence], prompting: list[Sequence]) -> int:
        """Room in the shared KV cache: idle caches go first, then the longest
        generating sequence shifts (or, if it may not, ends and leaves
        ``generating``). Returns the cells in use."""
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
        return used

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
                vision = self.model.require_vision()
                self.interrupt.disarm()  # a cut here would fail the request
                seq.prompt_ns += vision.decode(self.ctx, image, pos, seq.slot, self.n_batch)
            except EngineError as e:
                self._fail(seq, e)
                return True
            self.beat()
            slot.cached.extend(seq.job.tokens[seq.fed : seq.fed + image.n_tokens])
            slot.images.append(image.span(pos))
            seq.fed += image.n_tokens
            return True
        return False

    def _fill_batch(
        self,
        generating: list[Sequence],
        prompting: list[Sequence],
        room: int,
        outputs: list[tuple[Sequence, int]],
        fed: list[tuple[Sequence, int]],
    ) -> int:
        """Fill the batch: the next token of each generating sequence, then
        the oldest prompts' chunks (each up to its next image) within
        ``room``. The positions to sample go to ``outputs``, the chunks to
        ``fed``. Returns the tokens in the batch; the drafts' count goes to
        ``self.shape`` (``runner.step_costs``)."""
        b = self.batch
        n = 0
        # rows of logits left for drafts: llama.cpp aborts on a step asking for more
        rows = self.n_outputs - len(generating) - len(prompting)
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
            k = add_draft(self, seq, n + 1, max(0, min(room, rows)))  # then its draft
            n, room, rows = n + 1 + k, room - k, rows - k  # (runner.speculative)
            self.shape.drafted += k
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
        return n

    def _context_full(self, prompting: list[Sequence]) -> None:
        """Nothing fit the batch. A sequence that ended making room this step
        (at the end of the context, not allowed to shift) left its cells as
        an idle cache: it goes, and the prompts go on next step. Else the
        prompts fill the shared cache between them, and the newest gives way."""
        if self._drop_idle_cache():
            return
        self._fail(
            prompting[-1],
            EngineError(
                f"the context ({self.n_ctx} tokens, shared by {len(prompting)} prompts) "
                "is full; raise num_ctx or lower num_parallel"
            ),
        )

    def _decode(
        self, n: int, outputs: list[tuple[Sequence, int]], fed: list[tuple[Sequence, int]]
    ) -> int | None:
        """Decode the batch's ``n`` tokens. Returns the time it took, or None
        where it failed (every sequence in the batch ends with the error)."""
        self.batch.n_tokens = n
        t0 = time.perf_counter_ns()
        batch_only = all(q.job.priority == BATCH for q, _ in [*outputs, *fed])
        rc = self.interrupt.decode(self.batch, batch_only)
        elapsed = time.perf_counter_ns() - t0
        if rc == ABORTED and self.interrupt.cut_last:
            return None  # interactive work arrived: it goes first, this step runs again
        if rc != 0:
            error = EngineError(f"llama_decode failed with status {rc}")
            for seq in {id(q): q for q, _ in [*outputs, *fed]}.values():
                self._fail(seq, error)
            return None
        self.beat()
        return elapsed

    def _cache_decoded(
        self, generating: list[Sequence], fed: list[tuple[Sequence, int]], elapsed: int
    ) -> None:
        """The decoded tokens join their slots' caches; a prompt's chunk counts
        the decode's time as prompt time."""
        for seq in generating:
            self.slots[seq.slot].cached.append(seq.next_token)
        for seq, count in fed:
            slot = self.slots[seq.slot]
            slot.cached.extend(seq.job.tokens[seq.fed : seq.fed + count])
            seq.fed += count
            seq.prompt_ns += elapsed

    def _sample(self, outputs: list[tuple[Sequence, int]]) -> None:
        for seq, index in outputs:
            try:
                next_tokens(self, seq, index)  # and any draft tokens it confirms
            except Exception as e:  # its output could not be read or sent: it alone ends
                self._drop(seq, e)


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
