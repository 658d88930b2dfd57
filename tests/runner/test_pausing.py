"""Pausing batch sequences for interactive ones (``runner.pausing``): the
rules as tables; the engine on a generated model, counted in decode steps;
and real runner processes, observed through their messages, never timed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cores import cores
from endless import ENDLESS_CONTEXT
from engine_run import GREEDY
from engine_run import EngineRun as Run
from runner_streams import text_and_done
from waiting import until

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.pausing import (
    MAX_PAUSES,
    MAX_SIT_OUT,
    Held,
    Move,
    next_move,
    pausable,
    sits_out,
)
from jupyter_llm.runner.protocol import Complete, LoadParams
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

PROMPT = "Tell me a story about the sea"


def held(index: int, batch: bool = True, paused: bool = False, pauses: int = 0, **kw: Any) -> Held:
    return Held(index, batch, paused, pauses, kw.get("progressed", True), kw.get("order", 0))


# -- the rules -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (held(0), True),  # a batch sequence never paused
        (held(0, batch=False), False),  # interactive work is never paused
        (held(0, paused=True), False),  # already paused
        (held(0, pauses=MAX_PAUSES - 1), True),
        (held(0, pauses=MAX_PAUSES), False),  # the bound: paused often enough
        (held(0, pauses=1, progressed=False), False),  # resumed, nothing decoded since
        (held(0, pauses=0, progressed=False), True),  # just started: pausing loses nothing
    ],
)
def test_which_sequence_may_be_paused(state, expected):
    assert pausable(state) is expected


INT, BAT = "interactive", "batch"


@pytest.mark.parametrize(
    ("held_", "idle", "waiting", "slots", "expected"),
    [
        ([], 2, [], 1, None),  # nothing to do
        ([], 2, [BAT, INT], 1, Move(start=1)),  # interactive before batch
        ([], 2, [BAT, BAT], 1, Move(start=0)),  # then by arrival
        ([held(0)], 1, [BAT], 1, None),  # batch never pauses batch
        ([held(0)], 1, [BAT, INT], 1, Move(start=1, pause=0)),  # interactive pauses batch
        ([held(0)], 0, [INT], 1, None),  # no id left to start it under
        ([held(0, batch=False)], 1, [INT], 1, None),  # interactive is never paused
        ([held(0, pauses=MAX_PAUSES)], 1, [INT], 1, None),  # the bound: it waits
        # the least paused batch sequence goes, then the highest id
        ([held(0, pauses=2), held(1), held(2)], 3, [INT], 3, Move(start=0, pause=2)),
        # a free slot: the earliest paused sequence resumes before any waiting job
        (
            [held(0, paused=True, order=2), held(1, paused=True, order=1)],
            2,
            [INT],
            1,
            Move(resume=1),
        ),
        ([held(0, paused=True), held(1, batch=False)], 2, [INT], 2, Move(resume=0)),
        # a free slot and nobody paused: the interactive job
        ([held(0, batch=False)], 1, [BAT, INT], 2, Move(start=1)),
    ],
)
def test_the_next_move(held_, idle, waiting, slots, expected):
    assert next_move(held_, idle, waiting, slots) == expected


def test_where_the_prompt_does_not_fit_beside_the_held_cells():
    # a pause that keeps the cells would not make room: one that drops them
    # (tests/runner/test_pause_dropping.py), where they make the room
    assert next_move([held(0)], 1, [INT], 1, short=1) is None  # it holds no cells
    assert next_move([held(0, paused=True)], 1, [INT], 1, short=1) == Move(resume=0)


@pytest.mark.parametrize(
    ("prompting", "sat_out", "expected"),
    [
        (True, 0, True),  # an interactive prompt's step holds it alone
        (True, MAX_SIT_OUT - 1, True),
        (True, MAX_SIT_OUT, False),  # the bound: batch work joins the next step
        (False, 0, False),  # no interactive prompt: everyone decodes
    ],
)
def test_when_batch_sequences_sit_a_step_out(prompting, sat_out, expected):
    assert sits_out(prompting, sat_out) is expected


# -- the engine, in decode steps -----------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("pausing") / "m.gguf", DemoModelSpec())


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Engine]:
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=1024, n_batch=32, n_threads=cores(), n_seq=1)
    )
    yield engine
    engine.close()


def run_alone(engine: Engine, prompt: str, n: int) -> list[int]:
    alone = Run(engine, prompt, BAT, num_predict=n)
    while alone.done is None:
        engine.step()
    return alone.tokens


def test_an_interactive_request_pauses_batch_work_and_it_loses_nothing(engine):
    reference = run_alone(engine, PROMPT, 60)
    batch = Run(engine, PROMPT, BAT, num_predict=60)
    while len(batch.text) < 10:  # the only slot is busy with batch work
        engine.step()
    before = len(batch.text)
    chat = Run(engine, "hello there", INT, num_predict=5)
    slot = next(s for s in engine.slots if s.seq is not None and s.seq.job is batch.job)
    assert slot.paused  # within the submit: before the next step
    steps = 0
    while chat.done is None:
        engine.step()
        steps += 1
        assert len(batch.text) == before  # paused: not one token while the chat runs
    # it started at once: its prompt, then five tokens, with nothing waiting before it
    assert steps <= 6
    assert not slot.paused and slot.seq.job is batch.job  # resumed as the chat ended
    while batch.done is None:
        engine.step()
    assert batch.done.done_reason == "length"
    assert batch.tokens == reference  # greedy output identical to an unpaused run


def test_batch_work_gets_on_under_a_continuous_stream_of_interactive_requests(engine):
    reference = run_alone(engine, PROMPT, 40)
    batch = Run(engine, PROMPT, BAT, num_predict=40)
    engine.step()
    chats = 0
    while batch.done is None:
        chat = Run(engine, f"question {chats}", INT, num_predict=3)  # always one more waiting
        chats += 1
        while chat.done is None and batch.done is None:
            engine.step()
        assert chats < 200, "the batch sequence made no progress"
    assert batch.tokens == reference
    # paused at most MAX_PAUSES times; it then ran to its end beside the stream
    assert chats > MAX_PAUSES
    while any(s.seq is not None for s in engine.slots) or engine.waiting:
        engine.step()


def test_batch_sequences_sit_out_an_interactive_prompts_steps_within_the_bound(model_path):
    """Two slots of batch work; an interactive prompt of many chunks pauses one
    and the other sits out its steps, at most MAX_SIT_OUT in a row, and still
    ends with the output of a run never held back."""
    engine = Engine(
        LoadParams(path=str(model_path), n_ctx=1024, n_batch=8, n_threads=cores(), n_seq=2)
    )
    try:
        reference = run_alone(engine, PROMPT, 30)
        batch = [Run(engine, PROMPT, BAT, num_predict=30) for _ in range(2)]
        while min(len(b.text) for b in batch) < 3:
            engine.step()
        long_prompt = " ".join(f"word{i}" for i in range(60))  # several chunks of 8
        chat = Run(engine, long_prompt, INT, num_predict=2)
        counts = []
        while chat.done is None:
            before = [len(b.text) for b in batch]
            engine.step()
            counts.append([len(b.text) for b in batch] != before)
        held_back = counts[:MAX_SIT_OUT]
        assert not any(held_back)  # the prompt's first steps hold it alone
        assert any(counts[MAX_SIT_OUT:])  # then the running batch sequence moves again
        while any(b.done is None for b in batch):
            engine.step()
        assert [b.tokens for b in batch] == [reference, reference]
    finally:
        engine.close()


# -- real runner processes -----------------------------------------------------------------------
async def test_a_runner_pauses_batch_work_for_an_interactive_request(endless_gguf: Path):
    """Every slot (one) holds a batch request that never ends by itself; an
    interactive request still starts and ends, the batch request goes on
    afterwards, and its greedy output is the output of a run never paused."""
    spec = LoadSpec(path=str(endless_gguf), n_ctx=ENDLESS_CONTEXT, n_batch=64, n_seq=1)
    runner = await start_runner_with(spec, load_timeout=60)
    endless = {**GREEDY, "num_predict": -1}
    try:
        text: list[str] = []
        batch = runner.complete(
            Complete(prompt=PROMPT, options=endless, priority=BAT, stream_interval=0.01)
        )
        reader = asyncio.ensure_future(read_into(batch, text))
        await until(lambda: "".join(text), 60, "the batch request's first tokens")
        chat = Complete(prompt="hello there", options={**GREEDY, "num_predict": 8})
        _, done = await asyncio.wait_for(text_and_done(runner.complete(chat)), 60)
        assert done["eval_count"] == 8 and not reader.done()
        at_answer = len("".join(text))
        await until(lambda: len("".join(text)) >= at_answer + 100, 60, "more batch text")
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await batch.aclose()
        got = "".join(text)  # before, across and after the pause
        reference = await first_chars(runner, Complete(prompt=PROMPT, options=endless), len(got))
        assert got == reference, "paused output differs from the unpaused run"
    finally:
        await runner.close()


async def read_into(stream: Any, text: list[str]) -> None:
    async for batch in stream:
        for message in batch:
            if message["type"] == "token":
                text.append(message["text"])


async def first_chars(runner: Any, request: Complete, n: int) -> str:
    text: list[str] = []
    stream = runner.complete(request)
    try:
        async for batch in stream:
            text.extend(m["text"] for m in batch if m["type"] == "token")
            if len("".join(text)) >= n:
                return "".join(text)[:n]
    finally:
        await stream.aclose()
    raise AssertionError("the reference run ended early")
