"""A paused batch sequence's KV cells, dropped for an interactive prompt
that finds the context full, and decoded again when it resumes
(``runner.pausing`` decides when; this module does it).

Dropping removes the sequence id's cells (``llama_memory_seq_rm``) and
forgets the slot's token record; the tokens those cells held (the slot's
``cached``: reused prefix, prompt fed so far, output but the last sampled
token, as a context shift left them) are kept in Python, with everything
the ``Sequence`` holds (sampler and grammar state, stop strings, logprobs,
drafts, the token sampled but not decoded yet), all untouched. On resume
the kept tokens go back in chunks of at most ``n_batch``, at the positions
they had, one chunk per loop step in a decode of their own (as an image
is), no logits asked for; the sequence then decodes its next token as if
never paused. Its greedy output is an unpaused run's up to llama.cpp's
arithmetic: cells computed in a chunk rather than one token a step may
differ in the last bits, which can tip a near-tie (the README says the same
of drafts). A refill's decode holds batch work alone, so an interactive
arrival may cut it short (``runner.interrupt``): it then runs again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llama_cpp

from jupyter_llm.runner.interrupt import ABORTED
from jupyter_llm.runner.protocol import EngineError

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.slot import Slot


def drop_cells(memory: object, slot: Slot) -> list[int]:
    """Remove ``slot``'s KV cells; returns the tokens they held, to decode
    again on resume."""
    kept = list(slot.cached)
    llama_cpp.llama_memory_seq_rm(memory, slot.index, -1, -1)
    slot.truncate(0)
    return kept


def refill_chunk(engine: Engine, slot: Slot, kept: list[int], running: int) -> bool | None:
    """Decode the next chunk of ``kept`` into ``slot`` (it holds a prefix
    of them), in the room the ``running`` sequences leave this step (idle
    caches dropped for it). True when ``slot`` holds them all again; False
    while not (no room now, or the decode was cut short); None where the
    decode failed (the sequence then ended with the error)."""
    done = len(slot.cached)
    need = min(engine.n_batch, len(kept) - done)
    while _used(engine) + need + running > engine.n_ctx and engine._drop_idle_cache():
        pass
    n = min(need, engine.n_ctx - _used(engine) - running)
    if n <= 0:
        return done >= len(kept)
    b = engine.batch
    for i in range(n):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = kept[done + i], done + i, 1, 0
        b.seq_id[i][0] = slot.index
    b.n_tokens = n
    rc = engine.interrupt.decode(b, True)
    if rc == ABORTED and engine.interrupt.cut_last:
        return False  # interactive work arrived: this chunk runs again later
    if rc != 0:
        assert slot.seq is not None
        engine._fail(slot.seq, EngineError(f"llama_decode failed with status {rc}"))
        return None
    engine.beat()
    slot.cached.extend(kept[done : done + n])
    return len(slot.cached) >= len(kept)


def _used(engine: Engine) -> int:
    return sum(len(s.cached) for s in engine.slots)
