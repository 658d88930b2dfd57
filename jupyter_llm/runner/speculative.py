"""Speculative decoding by prompt lookup: a sequence drafts the tokens that
followed the place in its own prompt or output whose context best matches
how its output ends now (``runner.prompt_lookup``), and the target model
checks them in the same ``llama_decode`` as every other sequence, one logit
row per drafted token. No second model is needed; where one is loaded
(``runner.draft_model``), its greedy drafts take the lookup's place,
verified the same way.

Exactness: position ``i`` of a draft is sampled with the sequence's own
sampler (its native chain, or its grammar); the drafted token is kept only
if it is the token sampled there, and the first token sampled that differs
from the draft is kept in its place (the bonus token). Every sampled token is
thus one the target would have produced from the same context, and the
sampler sees (and accepts, penalties and grammar included) exactly the
tokens emitted, each once: greedy output is the token decoding without a
draft picks, and sampled output keeps the target's distribution (each token
is drawn from the target's own distribution given the accepted prefix; the
draft only decides how many positions are computed at once). Up to
llama.cpp's arithmetic: logits computed beside other tokens of the same
sequence differ in the last bits, which can tip a near-tie (README). The rejected
positions' KV cells are removed (``llama_memory_seq_rm``), so the slot's
token record stays exactly what its cells hold.

A sequence whose drafts stopped paying keeps making lookup drafts in the
shadow, free, and drafts again when they would have paid
(``draft_policy.after_shadow``). Runs in the runner process only, called
from ``engine``'s step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import llama_cpp

from jupyter_llm.runner.context_window import common_prefix
from jupyter_llm.runner.draft_policy import (
    MAX_LENGTH,
    Shadow,
    Window,
    after_draft,
    after_shadow,
    draft_size,
    judged,
    may_draft,
    next_length,
    resumed,
)
from jupyter_llm.runner.prompt_lookup import PromptLookup
from jupyter_llm.runner.protocol import EngineError
from jupyter_llm.runner.step_costs import cut_beside, cut_draft, cut_short, priced_length

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.sequence import Sequence


@dataclass
class Drafting:
    """One sequence's drafting state and counters (``Done.draft_*``)."""

    index: PromptLookup | None  # prompt lookup's; None where a draft model drafts
    length: int  # the next draft's length (``draft_policy.next_length``)
    seen: int = 0  # generated tokens already in ``index``
    window: Window = field(default_factory=Window)
    draft: list[int] = field(default_factory=list)  # in the batch now, after ``next_token``
    proposed: list[int] = field(default_factory=list)  # the draft model's, for this step
    shadow: Shadow = field(default_factory=Shadow)  # while paused (prompt lookup only)
    shadow_draft: list[int] = field(default_factory=list)  # made, not decoded, not judged yet
    shadow_at: int = 0  # generated tokens when it was made: it guesses the ones after
    cut: int = 0  # the draft in the batch was cut to this by its cost (next_length)
    shadow_cut: int = 0  # the same, for the shadow draft
    drafted: int = 0
    accepted: int = 0
    # beside others (``step_costs.cut_beside``): a lookup draft cut to none, made, not
    # decoded, judged by the tokens that come; and the tokens of drafts and such probes
    # up to each one's first rejected token, and those accepted
    probe: list[int] = field(default_factory=list)
    probe_at: int = 0  # generated tokens when it was made
    tries: int = 0
    hits: int = 0

    @property
    def rate(self) -> float:
        """The chance a drafted token is accepted after the one before it,
        from the drafts and probes so far (a half before any)."""
        return (self.hits + 1) / (self.tries + 2)


def drafting_of(engine: Engine, seq: Sequence, wanted: int) -> Drafting:
    """``seq``'s drafting state, made when it first drafts, its length
    starting at ``wanted`` (``draft_num_predict``)."""
    if seq.drafting is None:
        index = None if engine.drafter is not None else PromptLookup(seq.job.tokens)
        seq.drafting = Drafting(index, wanted)
    return seq.drafting


def add_draft(engine: Engine, seq: Sequence, n: int, room: int) -> int:
    """Put ``seq``'s draft into the engine's batch from index ``n`` (after
    its ``next_token``), in at most ``room`` cells; returns how many went in.
    The draft is prompt lookup's, or the draft model's, sized and priced
    already (``prepare_drafts``: only cut to the room left here), by what
    else the step holds (``engine.shape``, ``step_costs.StepShape``)."""
    if engine.drafter is not None:
        state = seq.drafting
        if state is None:
            return 0
        state.draft, state.proposed = state.proposed[: max(0, room)], []
    else:
        size = _draft_length(engine, seq, room)
        state = seq.drafting
        if state is None or state.index is None:
            return 0
        alone = engine.shape.alone
        state.draft = cut_short(engine.step_costs, state.index.propose(size), size, alone)
    batch, pos = engine.batch, len(engine.slots[seq.slot].cached) + 1
    for i, token in enumerate(state.draft):
        k = n + i
        batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = token, pos + i, 1, 1
        batch.seq_id[k][0] = seq.slot
    return len(state.draft)


def _draft_length(engine: Engine, seq: Sequence, room: int) -> int:
    """How many tokens ``seq`` drafts this step within ``room`` (0: none)."""
    shape = engine.shape
    wanted = int(seq.opts.get("draft_num_predict") or 0)
    if wanted <= 0 or engine.model.recurrent:  # it cannot drop its last positions
        return 0
    if engine.invariant and not shape.alone:
        # a rejected draft's freed cells would go to the others' next tokens,
        # out of their positions' order, and attention adds a sequence's
        # cells in the cache's order: their logits would move (README)
        return 0
    if engine.threads is not None and engine.threads.measuring:
        return 0  # steps of one token each, while the thread count is probed
    state = drafting_of(engine, seq, wanted)
    if state.index is not None:
        state.index.extend(seq.generated[state.seen :])
    state.seen = len(seq.generated)
    budget = seq.limit - len(seq.generated) if seq.limit >= 0 else -1
    shadowed = state.index is not None  # lookups are free: a pause drafts in the shadow
    if not may_draft(state.window, len(seq.generated), shadowed):
        if not (shadowed and shadow_step(engine, seq, state, budget)):
            return 0
    size, cap = draft_size(state.length, budget, room), draft_size(MAX_LENGTH, budget, room)
    costs, generated = engine.step_costs, len(seq.generated)
    priced = priced_length(costs, state, size, cap, generated, shape.sequences)
    if shape.sequences > 1 and not shape.prompting and state.index is not None:
        # its rows delay the others, after the drafts already in the step (a draft
        # model's drafts keep their length: no probes teach it the rate while it
        # drafts nothing)
        size, state.cut = cut_beside(
            costs, priced, state.length, shape.sequences, shape.drafted, state.rate
        )
        if not size:
            probe(state, seq.generated, priced)
        return size
    size, state.cut = cut_draft(costs, priced, state.length, shape.alone)
    return size


def shadow_step(engine: Engine, seq: Sequence, state: Drafting, budget: int) -> bool:
    """A paused sequence's shadow drafting (``draft_policy.after_shadow``):
    judge its last shadow draft once the tokens since settle it (one that
    differs, or all of them seen), resume drafting if the shadow window
    would have paid (True), else make the next shadow draft."""
    assert state.index is not None
    draft = state.shadow_draft
    if draft:
        matched = settled(draft, seq.generated[state.shadow_at :])
        if matched is None:
            return False
        cost = engine.step_costs.cost(len(draft), engine.shape.sequences, estimate=True)
        state.shadow, resume = after_shadow(state.shadow, len(draft), matched, cost)
        state.length = next_length(state.length, len(draft), matched, state.shadow_cut)
        state.shadow_draft = []
        if resume:
            state.window = resumed(state.window)
            return True
    size = draft_size(state.length, budget, MAX_LENGTH)  # cut as a real draft would be
    costs, alone = engine.step_costs, engine.shape.alone
    size, state.shadow_cut = cut_draft(costs, size, state.length, alone, False)
    state.shadow_draft = cut_short(costs, state.index.propose(size), size, alone, False)
    state.shadow_at = len(seq.generated)
    return False


def probe(state: Drafting, generated: list[int], size: int) -> None:
    """A draft cut to none beside others (``step_costs.cut_beside``) still
    teaches the sequence's acceptance: the last probe is judged once the
    tokens since settle it (one that differs, or all of them seen), and the
    next is made, ``size`` long. Without it a sequence whose first drafts
    looked unlikely to pay would never draft beside others, however well
    its lookup came to guess (a quote starting late)."""
    assert state.index is not None
    draft = state.probe
    if draft:
        matched = settled(draft, generated[state.probe_at :])
        if matched is None:
            return
        state.tries, state.hits = state.tries + judged(len(draft), matched), state.hits + matched
    state.probe, state.probe_at = state.index.propose(size), len(generated)


def settled(draft: list[int], seen: list[int]) -> int | None:
    """How many of a draft made but not decoded (a shadow draft, a probe)
    the tokens generated since agree with, once they settle it (one that
    differs, or all of it seen); None while every token so far is as
    guessed and more are to come."""
    matched = common_prefix(draft, seen)
    return None if matched == len(seen) < len(draft) else matched


def prepare_drafts(engine: Engine, generating: list[Sequence], room: int) -> int:
    """With a draft model, draft for every generating sequence at once (one
    draft decode per position for all of them) before the batch is filled,
    within the ``room`` the batch will have, taken in the same order. Returns
    the nanoseconds the draft model took: part of what its drafts cost
    (``runner.step_costs``)."""
    if engine.drafter is None:
        return 0
    t0 = time.perf_counter_ns()
    wants = []
    for seq in generating:
        size = _draft_length(engine, seq, room)
        room -= size
        if size:
            wants.append((seq, size))
    for slot, draft in engine.drafter.propose(engine, wants).items():
        seq = engine.slots[slot].seq
        if seq is not None and seq.drafting is not None:
            seq.drafting.proposed = draft
    return time.perf_counter_ns() - t0


def next_tokens(engine: Engine, seq: Sequence, index: int) -> None:
    """Sample ``seq`` at batch position ``index``, then at each drafted
    position while the sampled token is the drafted one; emit each sampled
    token (stop strings, logprobs, limits as usual) and end the sequence
    where one ends it. The draft's cells past the kept tokens are removed."""
    if not seq.generating_since:
        seq.generating_since = time.perf_counter_ns()
        if seq.limit == 0:
            engine._finish(seq, "length")
            return
    draft = seq.drafting.draft if seq.drafting is not None else []
    slot = engine.slots[seq.slot]
    matched, going = 0, True
    for i in range(len(draft) + 1):
        token = seq.sampler.sample(engine.ctx, index + i)
        eog = llama_cpp.llama_vocab_is_eog(engine.vocab, token)
        if seq.job.logprobs >= 0 and not eog:
            seq.job.on_logprob(engine.logprobs.entry(index + i, token, seq.job.logprobs))
        piece = b"" if eog else engine._piece_bytes(token, token in seq.job.preserve)
        going = seq.accept(token, piece, eog)
        if not going or i == len(draft) or token != draft[i]:
            break
        slot.cached.append(token)  # its cell was decoded with the draft
        matched += 1
    if draft:
        settle(engine, seq, len(draft), matched)
    if not going:
        engine._finish(seq, seq.reason)


def settle(engine: Engine, seq: Sequence, drafted: int, matched: int) -> None:
    """Count the verified draft and drop the cells of its rejected tokens.
    Its tokens are priced as every drafted token of the step
    (``step_costs.StepCosts.cost``: all the step's drafts over its sequences)."""
    state = seq.drafting
    assert state is not None
    state.draft = []
    state.drafted += drafted
    state.accepted += matched
    state.tries, state.hits = state.tries + judged(drafted, matched), state.hits + matched
    shape = engine.shape
    cost = engine.step_costs.cost(max(drafted, shape.drafted), shape.sequences, estimate=True)
    state.window = after_draft(state.window, drafted, matched, len(seq.generated), cost)
    state.length = next_length(state.length, drafted, matched, state.cut)
    slot = engine.slots[seq.slot]
    if matched < drafted and not llama_cpp.llama_memory_seq_rm(
        engine.memory, slot.index, len(slot.cached), -1
    ):
        raise EngineError("the KV cache could not drop the rejected draft tokens")
