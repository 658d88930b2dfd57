"""A draft model for speculative decoding (issue 26 item 2, runner/draft_model.py):
a second GGUF sharing the vocabulary drafts greedily; the target verifies as
it does prompt lookup's drafts. Greedy output never changes; a model drafting
for itself has nearly every draft accepted, which holds only while the draft
context stays in step with the target's slots (two sequences, context
shifts, a prompt cache restored from RAM). Real engines, no mocks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from cores import cores
from engine_run import EngineRun as Run
from engine_run import finish
from rewrite_prompt import REWRITE_PROMPT
from runner_streams import text_and_done

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.context_window import common_prefix
from jupyter_llm.runner.draft_model import (
    MAX_VOCAB_DIFFERENCE,
    open_draft,
    vocab_mismatch,
)
from jupyter_llm.runner.draft_policy import MAX_LENGTH
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.model import Model
from jupyter_llm.runner.protocol import Complete, EngineError, LoadParams
from jupyter_llm.runner.step_costs import StepCosts
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

PROMPTS = ["hello world hello world hello", "the cat sat on the mat and the cat sat"]
TARGET = DemoModelSpec(n_embd=128, n_layer=4, n_ff=256, attn_scale=0.1)  # context matters


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A generated target and a smaller draft with the same tokenizer."""
    d = tmp_path_factory.mktemp("draft")
    return write_demo_model(d / "t.gguf", TARGET), write_demo_model(d / "s.gguf", DemoModelSpec())


def load(target: Path, draft: Path | str = "", **kw: Any) -> Engine:
    params = {"n_ctx": 512, "n_batch": 32, "n_threads": 2, "n_seq": 2, **kw}
    engine = Engine(LoadParams(path=str(target), draft=str(draft), **params))
    # drafted tokens cost nothing here, so how much is drafted does not hang on
    # the machine's speed (runner/step_costs.py prices drafts by measured steps)
    engine.step_costs = StepCosts(engine.n_seq, engine.n_batch, pinned=0.0)
    return engine


def solo(engine: Engine, prompt: str, **options: Any) -> Run:
    run = Run(engine, prompt, **options)
    (finish if engine.drafter is None else finish_in_step)(engine, run)
    return run


def in_step(engine: Engine) -> None:
    """The draft context holds exactly its records, within its cells."""
    drafter = engine.drafter
    assert drafter is not None
    for index, record in enumerate(drafter.records):
        assert llama_cpp.llama_memory_seq_pos_max(drafter.memory, index) == len(record) - 1
    assert sum(len(r) for r in drafter.records) <= drafter.n_ctx


def finish_in_step(engine: Engine, *runs: Run) -> None:
    """``finish``, checking after every step that drafted that the slot's
    record is what its target slot holds, up to the draft's rejected tail."""
    drafted = {}
    while not all(r.ended for r in runs):
        engine.step()
        for slot in engine.slots:
            state = slot.seq.drafting if slot.seq is not None else None
            if state is None or drafted.get(slot.index) == state.drafted:
                continue
            drafted[slot.index] = state.drafted
            record = engine.drafter.records[slot.index]
            shared = common_prefix(record, slot.cached)
            assert shared >= len(slot.cached) - 1 - MAX_LENGTH, (slot.index, shared)
    for r in runs:
        assert not r.errors, r.errors
    in_step(engine)


def mostly_accepted(done: Any, rate: float = 0.9) -> None:
    assert done.draft_tokens > 10, done
    assert done.draft_accepted >= rate * done.draft_tokens, done


# -- a smaller generated draft -------------------------------------------------------------
def test_greedy_output_is_the_same_with_a_draft_model_prompt_lookup_and_none(pair):
    target, draft = pair
    plain = load(target)
    try:
        off = {p: solo(plain, p, num_predict=60, draft_num_predict=0) for p in PROMPTS}
        lookup = {p: solo(plain, p, num_predict=60) for p in PROMPTS}
    finally:
        plain.close()
    engine = load(target, draft)
    try:
        for p in PROMPTS:
            spec = solo(engine, p, num_predict=60)
            assert spec.done.context == off[p].done.context == lookup[p].done.context
            assert spec.output == off[p].output
            assert spec.done.draft_tokens > 0  # the draft model drafted
            in_step(engine)
        assert solo(engine, PROMPTS[0], num_predict=20, draft_num_predict=0).done.draft_tokens == 0
    finally:
        engine.close()


# -- a model drafting for itself: nearly everything accepted while in step -----------------
def test_two_sequences_draft_together_and_stay_in_step(pair):
    target, _ = pair
    engine = load(target, target)
    try:
        alone = [solo(engine, p, num_predict=80, draft_num_predict=0).done.context for p in PROMPTS]
        decodes: list[int] = []
        real = llama_cpp.llama_decode

        def counted(ctx: Any, batch: Any) -> int:
            if ctx == engine.drafter.ctx:
                decodes.append(batch.n_tokens)
            return real(ctx, batch)

        llama_cpp.llama_decode = counted
        try:
            runs = [Run(engine, p, num_predict=80) for p in PROMPTS]
            finish_in_step(engine, *runs)
        finally:
            llama_cpp.llama_decode = real
        assert [r.done.context for r in runs] == alone
        for r in runs:
            mostly_accepted(r.done)
        assert max(decodes) >= 2  # both sequences' draft positions in one batch
        in_step(engine)
    finally:
        engine.close()


def test_a_context_shift_resyncs_the_draft(pair):
    target, _ = pair
    engine = load(target, target, n_ctx=256, n_seq=1)  # llama.cpp's smallest context
    try:
        plain = solo(engine, PROMPTS[0], num_predict=600, draft_num_predict=0)
        while engine._drop_idle_cache():  # an idle cache would leave drafts no room
            pass
        spec = solo(engine, PROMPTS[0], num_predict=600, draft_num_predict=4)
        assert len(engine.slots[0].cached) < 600  # shifted
        assert spec.done.context == plain.done.context and spec.done.eval_count == 600
        # 0.91 in a fresh process, 0.79-0.80 in some runs after the other
        # tests (open: what differs); 0.66 where the draft decoded the shifted
        # tokens afresh instead of shifting its cells as the target did. A
        # draft out of step fails finish_in_step's check of its records
        mostly_accepted(spec.done, 0.6)
        in_step(engine)
    finally:
        engine.close()


def test_a_prefix_restored_from_ram_resyncs_the_draft(pair):
    target, _ = pair
    first = "The notebook's first question about pandas DataFrames. " * 8
    other = "Another user's notebook asks about matplotlib figures instead. " * 8
    ram = {"max_bytes": 256 << 20, "min_tokens": 64}
    engine = load(target, target, n_ctx=2048, n_batch=64, n_seq=1, prompt_ram=ram)
    try:
        answer = solo(engine, first, num_predict=12).output
        for i in range(len(engine.slots)):  # every slot (spare ids too) taken by others
            solo(engine, f"{i}: {other}", num_predict=12)
        follow = first + answer + " And a second question."
        restored = solo(engine, follow, num_predict=60)
        assert restored.done.prompt_cache == "ram"
        mostly_accepted(restored.done)
        in_step(engine)
        off = solo(engine, follow, num_predict=60, draft_num_predict=0)
        assert restored.done.context == off.done.context
    finally:
        engine.close()


def paused(engine: Engine, draft: int) -> Run:
    """Batch work fills the context; at 150 cells a chat arrives, the batch
    sequence's cells are dropped (runner.pausing), the chat ends, and its
    cells are decoded again (runner.refill) before it goes on."""
    while engine._drop_idle_cache():  # each run reads its prompt whole
        pass
    batch = Run(engine, PROMPTS[0], "batch", num_predict=200, draft_num_predict=draft)
    while len(batch.text) < 2 or len(batch.slot(engine).cached) < 150:
        engine.step()
    slot = batch.slot(engine)
    chat = Run(engine, " ".join(["hello there"] * 14), "interactive", num_predict=4)
    assert slot.paused
    engine.step()
    assert slot.cached == []  # its cells went
    finish_in_step(engine, batch, chat)
    return batch


def test_a_paused_sequence_whose_cells_were_dropped_resyncs_the_draft(pair):
    """The same output as without drafts through the same pause (a refill's
    chunks may tip a near-tie against an unpaused run, drafts or not), most
    drafts accepted, and the draft context in step after."""
    target, _ = pair
    engine = load(target, target, n_ctx=256, n_seq=1)
    try:
        off = paused(engine, 0)
        spec = paused(engine, 4)
        assert spec.done.context == off.done.context
        mostly_accepted(spec.done)
        in_step(engine)
    finally:
        engine.close()


def test_cut_steps_resync_the_draft(pair):
    """Batch-only steps cut by interactive arrivals (runner.interrupt) run
    again: the same output, the draft context in step."""
    from test_step_interrupt import cut_while_running

    target, _ = pair
    engine = load(target, target)
    try:
        reference = [solo(engine, p, num_predict=40, draft_num_predict=0) for p in PROMPTS]
        cut = cut_while_running(engine, PROMPTS, 40, draft_num_predict=4)
        assert [a.done.context for a in cut] == [a.done.context for a in reference]
        for a in cut:
            mostly_accepted(a.done)
        in_step(engine)
    finally:
        engine.close()


def test_the_draft_models_decodes_are_part_of_what_a_draft_costs(pair, monkeypatch):
    """A draft model's own decodes are time the drafts cost: the step costs
    see them (runner.step_costs). The clock that times them is a fake one
    that only the draft model's work moves (a second per call), so nothing
    here hangs on the machine's speed."""
    from jupyter_llm.runner import speculative

    class Clock:
        now = 0

        @staticmethod
        def perf_counter_ns() -> int:
            return Clock.now

    target, _ = pair
    engine = load(target, target)
    try:
        engine.step_costs = StepCosts(engine.n_seq, engine.n_batch)  # measured, not pinned
        propose, observed = engine.drafter.propose, []

        def slow_propose(eng: Engine, wants: list) -> dict:
            Clock.now += 10**9 if wants else 0
            return propose(eng, wants)

        monkeypatch.setattr(speculative, "time", Clock)
        monkeypatch.setattr(engine.drafter, "propose", slow_propose)
        record = engine.step_costs.observe
        monkeypatch.setattr(
            engine.step_costs,
            "observe",
            lambda s, t, ns: (observed.append((s, t, ns)), record(s, t, ns)),
        )
        solo(engine, PROMPTS[0], num_predict=30)
        drafted = [ns for s, t, ns in observed if t > s]
        assert drafted and all(ns >= 10**9 for ns in drafted), observed
    finally:
        engine.close()


# -- vocabularies --------------------------------------------------------------------------
def test_vocab_rule(tmp_path: Path, pair):
    target, _ = pair
    near = write_demo_model(tmp_path / "near.gguf", DemoModelSpec(extra_tokens=("<a>", "<b>")))
    many = tuple(f"<x{i}>" for i in range(MAX_VOCAB_DIFFERENCE + 1))
    far = write_demo_model(tmp_path / "far.gguf", DemoModelSpec(extra_tokens=many))
    models = [Model(LoadParams(path=str(p))) for p in (target, near, far)]
    try:
        t, n, f = (m.vocab for m in models)
        assert vocab_mismatch(t, t) == ""
        assert vocab_mismatch(t, n) == ""  # two added tokens: within the bound
        assert "tokens against" in vocab_mismatch(t, f)
    finally:
        for m in models:
            m.close()


def test_a_vocabulary_mismatch_is_refused_at_load_and_frees_everything(tmp_path: Path, pair):
    target, _ = pair
    many = tuple(f"<x{i}>" for i in range(MAX_VOCAB_DIFFERENCE + 1))
    far = write_demo_model(tmp_path / "far.gguf", DemoModelSpec(extra_tokens=many))
    counts = {"load": 0, "free": 0, "init": 0, "ctx_free": 0}
    real = {
        "load": llama_cpp.llama_model_load_from_file,
        "free": llama_cpp.llama_model_free,
        "init": llama_cpp.llama_init_from_model,
        "ctx_free": llama_cpp.llama_free,
    }
    names = {
        "load": "llama_model_load_from_file",
        "free": "llama_model_free",
        "init": "llama_init_from_model",
        "ctx_free": "llama_free",
    }

    def counting(key: str) -> Any:
        def call(*args: Any) -> Any:
            counts[key] += 1
            return real[key](*args)

        return call

    for key, name in names.items():
        setattr(llama_cpp, name, counting(key))
    try:
        with pytest.raises(EngineError) as error:
            load(target, far)
    finally:
        for key, name in names.items():
            setattr(llama_cpp, name, real[key])
    message = str(error.value)
    assert f"draft model {far} does not share {target}'s vocabulary" in message
    assert counts["load"] == counts["free"] == 2  # target and draft, both freed
    assert counts["init"] == counts["ctx_free"]  # every context made was freed

    engine = load(target)  # the engine's own close on a draft opened later
    with pytest.raises(EngineError):
        open_draft(engine, replace(LoadParams(path=str(target)), draft=str(far)))
    assert engine.ctx is None and engine.model.llama_model is None


def test_a_missing_draft_file_is_a_clear_error(tmp_path: Path, pair):
    target, _ = pair
    with pytest.raises(EngineError, match="failed to load the draft model"):
        load(target, tmp_path / "absent.gguf")


# -- through a runner process -------------------------------------------------------------
async def test_a_runner_process_drafts_with_its_draft_model(tmp_path: Path, pair):
    """``LoadParams.draft`` over the protocol: the done message counts the
    draft model's drafts; a mismatched one fails the load with its reason."""
    target, _ = pair
    spec = LoadSpec(path=str(target), n_ctx=512, n_batch=32, n_seq=1, draft=str(target))
    runner = await start_runner_with(spec, load_timeout=60)
    try:
        stream = runner.complete(
            Complete(prompt=PROMPTS[0], options={"temperature": 0, "num_predict": 60})
        )
        _, done = await text_and_done(stream)
    finally:
        await runner.close()
    assert done["draft_tokens"] > 10 and done["draft_accepted"] >= 0.9 * done["draft_tokens"]
    many = tuple(f"<x{i}>" for i in range(MAX_VOCAB_DIFFERENCE + 1))
    far = write_demo_model(tmp_path / "far.gguf", DemoModelSpec(extra_tokens=many))
    with pytest.raises(Exception, match="does not share") as error:
        await start_runner_with(replace(spec, draft=str(far)), load_timeout=60)
    assert str(far) in str(error.value)


# -- the real model ------------------------------------------------------------------------


@pytest.mark.timeout(600)  # a 270M model loaded three times on two busy cores
def test_gemma_drafting_for_itself(gemma_gguf: Path, pair):
    prompt = REWRITE_PROMPT
    plain = Engine(LoadParams(path=str(gemma_gguf), n_ctx=1024, n_threads=cores(), n_seq=2))
    try:
        off = solo(plain, prompt, num_predict=48, draft_num_predict=0)
        demo = Model(LoadParams(path=str(pair[1])))
        try:  # a different tokenizer altogether
            assert vocab_mismatch(plain.vocab, demo.vocab)
        finally:
            demo.close()
    finally:
        plain.close()
    gemma = load(gemma_gguf, gemma_gguf, n_ctx=1024, n_batch=512)
    try:
        spec = solo(gemma, prompt, num_predict=48)
        assert spec.done.context == off.done.context
        mostly_accepted(spec.done)
        in_step(gemma)
    finally:
        gemma.close()


def test_a_token_past_the_drafts_vocabulary_is_never_sent_to_it(tmp_path: Path, pair):
    """The vocabularies may differ by a few added tokens. A context holding
    one the draft lacks (an Ollama ``context`` is checked against the
    target's vocabulary only) made every draft decode of the slot fail, and
    the slot's whole context was decoded again at each step, to fail again.
    Such a slot drafts nothing; the answer is the target's own."""
    from jupyter_llm.runner.sequence import Job

    _, draft = pair
    wide = write_demo_model(tmp_path / "wide.gguf", replace(TARGET, extra_tokens=("<a>", "<b>")))
    engine = load(wide, draft)
    drafter = engine.drafter
    assert drafter is not None
    decoded: list[int] = []
    real_decode = drafter._decode

    def counted(n: int) -> None:
        decoded.extend(drafter.batch.token[i] for i in range(n))
        real_decode(n)

    drafter._decode = counted
    try:
        high = drafter.n_vocab  # "<a>": in the target's vocabulary, not in the draft's
        tokens = engine.model.prompt_tokens(PROMPTS[0])
        tokens = [*tokens[:3], high, *tokens[3:]]
        pieces: list[str] = []
        done: list[Any] = []
        errors: list[Exception] = []
        job = Job(
            rid=1,
            tokens=tokens,
            options={"temperature": 0, "num_predict": 30},
            emit=pieces.append,
            finish=done.append,
            fail=errors.append,
        )
        engine.submit(job)
        while not done and not errors:
            engine.step()
        assert errors == [] and done[0].eval_count == 30
        assert high not in decoded
        assert done[0].draft_tokens == 0
        assert solo(engine, PROMPTS[1], num_predict=30).done.draft_tokens > 0  # others draft
    finally:
        engine.close()
