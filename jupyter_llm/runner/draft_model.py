"""A draft model for speculative decoding: a second, smaller GGUF sharing the
target's vocabulary (``LoadParams.draft``) proposes each drafting sequence's
next tokens greedily; the target verifies them in its own batch step as it
does prompt lookup's (``runner.speculative``). Loaded, it replaces prompt
lookup for that model.

What is allocated (the server's estimate counts exactly this): the draft's
weights (mmap; all its layers on the first GPU that holds target layers,
where the target has any on a GPU, else none) and one context with the
target context's ``n_ctx``, sequence ids, batch, KV cache type and flash
attention, unified as the target's.

The draft context keeps its own record of the tokens each slot's cells hold.
Before drafting, each drafting slot's record is compared with the target
slot's tokens (plus the token about to be decoded): the common prefix stays,
the rest of the draft's cells go, and what is missing is decoded in batch
chunks. The target's tokens change under it (prompt caches restored,
context shifts, pauses, cut steps, rejected drafts); comparing each time
keeps the two in step without knowing why. Then one decode per drafted
position, all drafting sequences in one batch, each taking the argmax.

Runs in the runner process only, called from ``engine`` and ``speculative``.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np

from jupyter_llm.memory.outputs import draft_rows
from jupyter_llm.runner.context_window import common_prefix, swa_reusable
from jupyter_llm.runner.kv_cache import cache_types
from jupyter_llm.runner.model import has_recurrent_state, model_params
from jupyter_llm.runner.protocol import EngineError, LoadParams

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.sequence import Sequence

# llama.cpp's rule (common/speculative.cpp): vocabularies may differ in size
# by this much, and the text of every token from this id on must be equal
MAX_VOCAB_DIFFERENCE = 128
CHECK_FROM_TOKEN = 5
ALL_LAYERS = 999
MIN_SHIFTED = 8  # tokens of the target's that identify a shifted span in a record
MAX_SHIFT_PROBES = 64  # places looked at for it (a repetitive record has many)


def vocab_mismatch(target: Any, draft: Any) -> str:
    """Why two vocabularies (``llama_vocab`` pointers) cannot share drafts;
    "" when they can."""
    v = llama_cpp
    if v.llama_vocab_type(target) != v.llama_vocab_type(draft):
        return "the tokenizer types differ"
    for name, add, special in (
        ("BOS", v.llama_vocab_get_add_bos, v.llama_vocab_bos),
        ("EOS", v.llama_vocab_get_add_eos, v.llama_vocab_eos),
    ):
        if add(target) != add(draft) or (add(target) and special(target) != special(draft)):
            return f"the {name} tokens differ"
    n_target, n_draft = v.llama_vocab_n_tokens(target), v.llama_vocab_n_tokens(draft)
    if abs(n_target - n_draft) > MAX_VOCAB_DIFFERENCE:
        return f"{n_target} tokens against {n_draft}"
    for i in range(CHECK_FROM_TOKEN, min(n_target, n_draft)):
        if v.llama_vocab_get_text(target, i) != v.llama_vocab_get_text(draft, i):
            return f"token {i} differs"
    return ""


def first_gpu(params: LoadParams) -> int:
    """The first GPU that holds target layers: the draft's whole GPU share goes there."""
    return next((i for i, share in enumerate(params.tensor_split) if share > 0), params.main_gpu)


class DraftModel:
    """The draft's weights, its context and its per-slot token records."""

    def __init__(self, engine: Engine, params: LoadParams) -> None:
        self.llama_model: Any = None
        self.ctx: Any = None
        self.batch: Any = None
        gpu = ALL_LAYERS if params.n_gpu_layers != 0 else 0
        own = LoadParams(path=params.draft, n_gpu_layers=gpu, main_gpu=first_gpu(params))
        mp, self._load_refs = model_params(own, None)
        mp.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE  # one GPU, never spread
        self.llama_model = llama_cpp.llama_model_load_from_file(params.draft.encode(), mp)
        if not self.llama_model:
            raise EngineError(f"failed to load the draft model {params.draft}")
        try:
            self._open(engine, params)
        except EngineError:
            self.close()
            raise

    def _open(self, engine: Engine, params: LoadParams) -> None:
        self.vocab = llama_cpp.llama_model_get_vocab(self.llama_model)
        why = vocab_mismatch(engine.vocab, self.vocab)
        if why:
            raise EngineError(
                f"draft model {params.draft} does not share {params.path}'s vocabulary: {why}"
            )
        if has_recurrent_state(self.llama_model):
            raise EngineError(f"draft model {params.draft} is recurrent: it cannot draft")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.target_vocab = engine.model.n_vocab
        self.n_swa = int(llama_cpp.llama_model_n_swa(self.llama_model))
        self.n_ctx, self.n_batch = engine.n_ctx, engine.n_batch
        self.ctx = llama_cpp.llama_init_from_model(self.llama_model, self._context(engine, params))
        if not self.ctx:
            raise EngineError(f"failed to create the draft model's context ({params.draft})")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.can_shift = bool(llama_cpp.llama_memory_can_shift(self.memory))
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.records: list[list[int]] = [[] for _ in engine.slots]

    def _context(self, engine: Engine, params: LoadParams) -> Any:
        """The target context's shape: cells, sequence ids, batch, cache type."""
        from jupyter_llm.runner.engine import FLASH_ATTN_TYPES

        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = engine.n_ctx
        cp.n_batch = cp.n_ubatch = engine.n_batch
        cp.n_seq_max = len(engine.slots)
        cp.n_outputs_max = draft_rows(cp.n_seq_max)  # a row per slot a decode, at most
        cp.kv_unified = True
        cp.swa_full = False
        cp.flash_attn_type = FLASH_ATTN_TYPES[params.flash_attn]
        # the setting's types, without the batch-invariant q8_0 keys: the
        # drafts' logits never reach an answer (memory.estimate counts it so)
        own = replace(params, batch_invariant=False)
        if engine.kv_fallback:
            own = replace(own, kv_cache_type="f16")
        cp.type_k, cp.type_v = cache_types(own)
        if params.n_threads > 0:
            cp.n_threads = cp.n_threads_batch = params.n_threads
        return cp

    def close(self) -> None:
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.llama_model:
            llama_cpp.llama_model_free(self.llama_model)
            self.llama_model = None

    # -- drafting ------------------------------------------------------------------------
    def propose(self, engine: Engine, wants: list[tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Drafts for ``wants`` (each sequence and its draft's length), by
        slot index: the draft model's greedy continuation of each target
        slot's tokens and its next token."""
        todo: list[tuple[int, int, list[int]]] = []  # slot, length, tokens to decode
        for seq, size in wants:
            slot = engine.slots[seq.slot]
            if size <= 0 or slot.images or seq.next_token < 0:
                continue
            missing = self._sync(slot.index, [*slot.cached, seq.next_token])
            if max(missing) >= self.n_vocab:  # a target token the draft lacks: it cannot decode it
                continue
            todo.append((seq.slot, size, missing))
        if not todo:
            return {}
        self._make_room({s for s, _, _ in todo}, sum(len(m) + k - 1 for _, k, m in todo))
        drafts: dict[int, list[int]] = {s: [] for s, _, _ in todo}
        try:
            self._catch_up(todo, drafts)
            self._draft(todo, drafts)
        except EngineError:
            for s, _, _ in todo:  # cells of a failed decode are unknown: start again
                self._forget(s)
            return {}
        return drafts

    def _sync(self, index: int, target: list[int]) -> list[int]:
        """Cut slot ``index``'s record to what it shares with ``target``
        (never its last token: its logits start the draft); the tokens
        still to decode. Where the target's context shifted (a span gone
        from the middle), the draft's cells shift the same way."""
        record = self.records[index]
        keep = min(common_prefix(record, target), len(target) - 1)
        if keep and self.n_swa:
            pos_min = llama_cpp.llama_memory_seq_pos_min(self.memory, index)
            keep = swa_reusable(keep, pos_min, self.n_swa)
        keep += self._shifted(index, keep, target[keep:-1])
        if keep < len(record):
            if not llama_cpp.llama_memory_seq_rm(self.memory, index, keep, -1):
                keep = 0
                llama_cpp.llama_memory_seq_rm(self.memory, index, -1, -1)
            del record[keep:]
        return target[keep:]

    def _shifted(self, index: int, keep: int, rest: list[int]) -> int:
        """If the record holds ``rest`` (the target's tokens after the shared
        ``keep``) further on, as after a context shift, move those cells down
        to ``keep`` as the target did; how many tokens that kept."""
        record = self.records[index]
        if len(rest) < MIN_SHIFTED or not self.can_shift or (self.n_swa and not keep):
            return 0
        head = rest[:MIN_SHIFTED]
        start = keep + 1
        for _ in range(MAX_SHIFT_PROBES):
            try:
                q = record.index(head[0], start)
            except ValueError:
                return 0
            if record[q : q + MIN_SHIFTED] == head:
                break
            start = q + 1
        else:
            return 0
        n = common_prefix(record[q:], rest)
        if not llama_cpp.llama_memory_seq_rm(self.memory, index, keep, q):
            return 0
        llama_cpp.llama_memory_seq_add(self.memory, index, q, -1, keep - q)
        del record[keep:q]
        return n

    def _forget(self, index: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, index, -1, -1)
        self.records[index].clear()

    def _make_room(self, drafting: set[int], wanted: int) -> None:
        """Room for ``wanted`` more cells: the records of slots not drafting
        now go first (the target's room check already counted the rest)."""
        used = sum(len(r) for r in self.records)
        for index, record in enumerate(self.records):
            if used + wanted <= self.n_ctx:
                return
            if index not in drafting and record:
                used -= len(record)
                self._forget(index)

    def _decode(self, n: int) -> None:
        self.batch.n_tokens = n
        rc = llama_cpp.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise EngineError(f"the draft model's llama_decode failed with status {rc}")

    def _put(self, n: int, index: int, token: int, logits: bool) -> None:
        b, record = self.batch, self.records[index]
        b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, len(record), 1, int(logits)
        b.seq_id[n][0] = index
        record.append(token)

    def _argmax(self, row: int) -> int:
        logits = llama_cpp.llama_get_logits_ith(self.ctx, row)
        view = np.ctypeslib.as_array(
            ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,)
        )
        return int(view.argmax())

    def _catch_up(
        self, todo: list[tuple[int, int, list[int]]], drafts: dict[int, list[int]]
    ) -> None:
        """Decode what each record misses, in batch chunks; each slot's last
        token's logits give its first drafted token."""
        pending = [(s, t, i == len(m) - 1) for s, _, m in todo for i, t in enumerate(m)]
        for start in range(0, len(pending), self.n_batch):
            chunk = pending[start : start + self.n_batch]
            for n, (index, token, last) in enumerate(chunk):
                self._put(n, index, token, last)
            self._decode(len(chunk))
            for n, (index, _, last) in enumerate(chunk):
                if last:
                    drafts[index].append(self._argmax(n))

    def _draft(self, todo: list[tuple[int, int, list[int]]], drafts: dict[int, list[int]]) -> None:
        """One decode per further position, every drafting slot in it."""
        size = {s: k for s, k, _ in todo}
        while True:
            going = [s for s, d in drafts.items() if self._goes_on(d, size[s])]
            if not going:
                break
            for n, index in enumerate(going):
                self._put(n, index, drafts[index][-1], True)
            self._decode(len(going))
            for n, index in enumerate(going):
                drafts[index].append(self._argmax(n))
        for draft in drafts.values():  # never a token the target does not have
            cut = next((i for i, t in enumerate(draft) if t >= self.target_vocab), len(draft))
            del draft[cut:]

    def _goes_on(self, draft: list[int], size: int) -> bool:
        """Draft one more token after ``draft``? Not past its length, an end
        of generation, or a token the target does not have."""
        if not draft or len(draft) >= size:
            return False
        last = draft[-1]
        return last < self.target_vocab and not llama_cpp.llama_vocab_is_eog(self.vocab, last)


def open_draft(engine: Engine, params: LoadParams) -> DraftModel | None:
    """The engine's draft model, or None without one; a failure closes the
    engine (its context and model) before it is raised."""
    if not params.draft:
        return None
    try:
        return DraftModel(engine, params)
    except EngineError:
        engine.close()
        raise


def close_draft(engine: Engine) -> None:
    drafter = getattr(engine, "drafter", None)
    if drafter is not None:
        drafter.close()
