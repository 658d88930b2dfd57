"""Pausing batch work when the context is full (``runner.pausing`` drops a
batch sequence's KV cells, ``runner.refill`` decodes them again on resume):
the rule as a table; the engine on the generated model and on Gemma, driven
step by step (the interactive request arrives after an observed event, the
batch sequence's tokens), its greedy output compared with an unpaused run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cores import cores
from engine_run import EngineRun as Run

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.pausing import MAX_PAUSES, Held, Move, next_move
from jupyter_llm.runner.protocol import LoadParams

PROMPT = "Tell me a story about the sea"
INT, BAT = "interactive", "batch"


def held(index: int, cells: int, **kw: Any) -> Held:
    return Held(
        index,
        kw.get("batch", True),
        kw.get("paused", False),
        kw.get("pauses", 0),
        kw.get("progressed", True),
        0,
        cells,
        kw.get("droppable", True),
    )


# -- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("held_", "idle", "waiting", "short", "expected"),
    [
        # the prompt fits beside the held cells: pause, cells kept
        ([held(0, 100)], 1, [INT], 0, Move(start=0, pause=0)),
        # it does not: pause and drop the cells of the batch sequence
        ([held(0, 100)], 1, [INT], 40, Move(start=0, pause=0, drop=True)),
        ([held(0, 100)], 1, [INT], 100, Move(start=0, pause=0, drop=True)),
        ([held(0, 100)], 1, [INT], 101, None),  # its cells would not make the room: wait
        ([held(0, 100, droppable=False)], 1, [INT], 40, None),  # images: never dropped, wait
        ([held(0, 100)], 0, [INT], 40, None),  # no id left to start it under
        ([held(0, 100)], 1, [BAT], 40, None),  # batch never pauses batch
        ([held(0, 100, batch=False)], 1, [INT], 40, None),  # interactive is never dropped
        # the starvation bounds hold as for any pause
        ([held(0, 100, pauses=MAX_PAUSES)], 1, [INT], 40, None),
        ([held(0, 100, pauses=1, progressed=False)], 1, [INT], 40, None),
        # the least paused goes, then the fewest cells to decode again
        (
            [held(0, 90, pauses=1), held(1, 80), held(2, 50)],
            3,
            [INT],
            40,
            Move(start=0, pause=2, drop=True),
        ),
        # only one whose cells make the room
        ([held(0, 90), held(1, 30)], 2, [INT], 40, Move(start=0, pause=0, drop=True)),
        # a free slot: the paused sequence resumes first, dropped or not
        ([held(0, 0, paused=True)], 1, [INT], 40, Move(resume=0)),
    ],
)
def test_when_a_pause_drops_cells(held_, idle, waiting, short, expected):
    slots = sum(1 for h in held_ if not h.paused) or 1
    assert next_move(held_, idle, waiting, slots, short) == expected


# -- the engine ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(
        tmp_path_factory.mktemp("dropping") / "m.gguf", DemoModelSpec(attn_scale=1.0)
    )


def run_alone(engine: Engine, prompt: str, options: dict[str, Any]) -> list[int]:
    alone = Run(engine, prompt, BAT, **options)
    while alone.done is None:
        engine.step()
    while engine._drop_idle_cache():  # the next run reads its prompt whole, as this one did
        pass
    return alone.done.context


def paused_and_refilled(engine: Engine, at: int, options: dict[str, Any], chat: str) -> None:
    """Batch work fills the context; once it holds ``at`` cells, an
    interactive request arrives: it pauses the batch sequence, dropping its
    cells, starts and ends before it; the batch sequence then decodes its
    cells again and ends with the unpaused run's output."""
    reference = run_alone(engine, PROMPT, options)
    batch = Run(engine, PROMPT, BAT, **options)
    while not batch.text:  # its first token: it is decoding
        engine.step()
    while len(batch.slot(engine).cached) < at:
        engine.step()
    slot = batch.slot(engine)
    chat_run = Run(engine, chat, INT, num_predict=4)
    held = len(slot.cached)
    assert held + len(chat_run.job.tokens) + 1 > engine.n_ctx  # no room beside its cells
    assert slot.paused  # within the submit: the chat started under a spare id
    assert any(s.seq is not None and s.seq.job is chat_run.job for s in engine.slots)
    before = len(batch.text)
    engine.step()
    assert slot.cached == [] and slot.seq.job is batch.job  # its cells went, its state stayed
    while chat_run.done is None:
        assert batch.done is None and len(batch.text) == before  # the chat ends first
        engine.step()
    assert chat_run.done.eval_count == 4
    while len(slot.cached) < held:  # decoded again, a chunk a step, before it goes on
        assert slot.paused and len(batch.text) == before
        cells = len(slot.cached)
        engine.step()
        assert len(slot.cached) - cells <= engine.n_batch  # the bound: one batch a step
    while batch.done is None:
        engine.step()
    assert batch.done.context == reference  # greedy output identical to an unpaused run


@pytest.mark.parametrize("draft", [0, 4])
def test_a_full_context_drops_a_batch_sequences_cells_and_it_loses_nothing(model_path, draft):
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=256, n_batch=32, n_threads=cores(), n_seq=1)
    )
    try:
        options = {"num_predict": 200, "draft_num_predict": draft}
        chat = " ".join(["hello there"] * 14)
        paused_and_refilled(engine, 150, options, chat)
    finally:
        engine.close()


def test_a_sequence_refilled_after_a_context_shift_goes_on(model_path):
    """Its cells after a shift are not its prompt and output: the refill
    decodes what the cells held, and the sequence ends as ever."""
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=128, n_batch=16, n_threads=cores(), n_seq=1)
    )
    try:
        batch = Run(engine, PROMPT, BAT, num_predict=300)
        while len(batch.text) < 200:  # the context (128) shifted on the way
            engine.step()
        slot = batch.slot(engine)
        chat = Run(engine, " ".join(["hello there"] * 8), INT, num_predict=3)
        assert slot.paused
        while chat.done is None:
            engine.step()
        while batch.done is None:
            engine.step()
        assert batch.done.done_reason == "length" and batch.done.eval_count == 300
    finally:
        engine.close()


def test_two_batch_sequences_fill_the_context_and_one_gives_its_cells(model_path):
    """Two slots of batch work fill the context between them; a chat drops
    one's cells while the other decodes on beside it; both end with an
    unpaused run's output."""
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=256, n_batch=16, n_threads=cores(), n_seq=2)
    )
    try:
        reference = run_alone(engine, PROMPT, {"num_predict": 95})
        batch = [Run(engine, PROMPT, BAT, num_predict=95) for _ in range(2)]
        while sum(len(b.slot(engine).cached) for b in batch) < 200:
            engine.step()
        chat = Run(engine, " ".join(["hello there"] * 7), INT, num_predict=4)
        held = sum(len(b.slot(engine).cached) for b in batch)
        assert held + len(chat.job.tokens) + 1 > engine.n_ctx  # no room beside their cells
        paused = [b for b in batch if b.slot(engine).paused]
        assert len(paused) == 1
        other = next(b for b in batch if b is not paused[0])
        at_chat = len(other.text)
        engine.step()
        assert paused[0].slot(engine).cached == []  # dropped
        while chat.done is None:
            engine.step()
        assert len(other.text) > at_chat and paused[0].done is None  # it went on beside
        while any(b.done is None for b in batch):
            engine.step()
        assert [b.done.context for b in batch] == [reference, reference]
    finally:
        engine.close()


def test_a_chat_cancelled_before_the_next_step_leaves_the_cells_in_place(model_path):
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=256, n_batch=32, n_threads=cores(), n_seq=1)
    )
    try:
        reference = run_alone(engine, PROMPT, {"num_predict": 200})
        batch = Run(engine, PROMPT, BAT, num_predict=200)
        while len(batch.slot(engine).cached) < 150:
            engine.step()
        slot = batch.slot(engine)
        cells = list(slot.cached)
        gone = [False]
        chat = Run(engine, " ".join(["hello there"] * 14), INT, num_predict=4)
        chat.job.cancelled = lambda: gone[0]
        assert slot.paused  # to drop its cells before the next step
        gone[0] = True
        engine.step()  # the chat ends first: the batch sequence resumes, its cells kept
        assert chat.done is not None and chat.done.done_reason == "cancel"
        assert not slot.paused and slot.cached[: len(cells)] == cells
        while batch.done is None:
            engine.step()
        assert batch.done.context == reference
    finally:
        engine.close()


def test_a_batch_sequence_cancelled_while_its_cells_are_dropped_ends(model_path):
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=256, n_batch=32, n_threads=cores(), n_seq=1)
    )
    try:
        gone = [False]
        batch = Run(engine, PROMPT, BAT, num_predict=200)
        batch.job.cancelled = lambda: gone[0]
        while len(batch.slot(engine).cached) < 150:
            engine.step()
        slot = batch.slot(engine)
        chat = Run(engine, " ".join(["hello there"] * 14), INT, num_predict=4)
        engine.step()
        assert slot.cached == [] and slot.seq.job is batch.job  # its cells dropped
        gone[0] = True
        while chat.done is None or batch.done is None:
            engine.step()
        assert batch.done.done_reason == "cancel" and chat.done.eval_count == 4
        again = Run(engine, PROMPT, BAT, num_predict=5)  # its slot serves the next request
        while again.done is None:
            engine.step()
        assert again.done.eval_count == 5
    finally:
        engine.close()


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path) -> Iterator[Engine]:
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=256, n_batch=64, n_seq=1))
    yield engine
    engine.close()


def test_gemma_drops_and_refills_a_batch_sequence_with_the_same_output(gemma):
    options = {"num_predict": 180}
    chat = "Answer in one word: what colour is the sky on a clear day? " * 8
    paused_and_refilled(gemma, 150, options, chat)
