"""Interactive arrivals cut a batch-only decode step short (``runner.interrupt``):
the rule as a table; real engines on the generated model and on Gemma, where
a cut step leaves nothing behind (greedy output equal to an uncut run's), is
never cut twice in a row, and never cuts a step that holds interactive work.
The flag is set before the step rather than during it: the callback reads it
after every graph node either way, and a test must not depend on timing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_run import EngineRun, finish

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.interrupt import may_cut
from jupyter_llm.runner.protocol import LoadParams


@pytest.mark.parametrize(
    ("batch_only", "cut_last", "expected"),
    [
        (True, False, True),  # batch work alone: interactive work may cut it
        (True, True, False),  # never twice in a row: batch work advances
        (False, False, False),  # a step with interactive work runs whole
        (False, True, False),
    ],
)
def test_which_steps_may_be_cut(batch_only, cut_last, expected):
    assert may_cut(batch_only, cut_last) is expected


def cut_while_running(engine: Engine, prompts: list[str], n: int, **opts: Any) -> list[EngineRun]:
    """``prompts`` as batch work, each step after the first tokens cut once
    before it runs whole; returns the answers."""
    answers = [EngineRun(engine, p, "batch", num_predict=n, **opts) for p in prompts]
    while not all(a.text for a in answers):
        engine.step()
    cuts = engine.interrupt.cuts
    while any(a.done is None for a in answers):
        before = [len(a.text) for a in answers]
        engine.interrupt.request()  # interactive work arrived before this step
        engine.step()
        if engine.interrupt.cut_last:  # it left nothing behind
            assert [len(a.text) for a in answers] == before
            assert engine.interrupt.cuts == cuts + 1
            cuts += 1
            engine.interrupt.request()
            engine.step()  # the next step is not cut again: batch work advances
            assert not engine.interrupt.cut_last
        engine.interrupt.clear()
    assert cuts > 3
    return answers


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_demo_model(tmp_path_factory.mktemp("cut") / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_seq=2))
    assert engine.interrupt.available  # the C library's strlen was found
    yield engine
    engine.close()


PROMPTS = ["Tell me a story about the sea", "Once upon a time in a small town"]


@pytest.mark.parametrize("draft", [0, 4])
def test_cut_steps_leave_the_batch_output_unchanged(small, draft):
    options = {"num_predict": 40, "draft_num_predict": draft}
    reference = [EngineRun(small, p, "batch", **options) for p in PROMPTS]
    finish(small, *reference)
    cut = cut_while_running(small, PROMPTS, 40, draft_num_predict=draft)
    assert [a.done.context for a in cut] == [a.done.context for a in reference]
    assert ["".join(a.text) for a in cut] == ["".join(a.text) for a in reference]


def test_a_step_with_interactive_work_is_never_cut(small):
    batch = EngineRun(small, PROMPTS[0], "batch", num_predict=30)
    chat = EngineRun(small, PROMPTS[1], "interactive", num_predict=30)
    cuts = small.interrupt.cuts
    while chat.done is None:
        small.interrupt.request()
        small.step()
        assert small.interrupt.cuts == cuts
    small.interrupt.clear()
    finish(small, batch)


def test_an_unset_flag_cuts_nothing(small):
    cuts = small.interrupt.cuts
    answer = EngineRun(small, PROMPTS[0], "batch", num_predict=20)
    finish(small, answer)
    assert small.interrupt.cuts == cuts


def test_gemma_cut_steps_leave_the_output_unchanged(gemma_gguf: Path):
    """Sliding-window layers and a 262k vocabulary: the rollback of a cut step
    leaves the caches as they were. Drafts stay off here: on Gemma a verified
    draft's logits come from a wider matrix product than one token's, and a
    near tie can then differ between two uncut runs as well."""
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=1024, n_seq=2))
    try:
        turn = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
        asks = ("Write a short note about tides.", "Name three rivers.")
        prompts = [turn.format(q) for q in asks]
        options = {"num_predict": 32, "draft_num_predict": 0}
        reference = [EngineRun(engine, p, "batch", **options) for p in prompts]
        finish(engine, *reference)
        cut = cut_while_running(engine, prompts, 32, draft_num_predict=0)
        assert [a.done.context for a in cut] == [a.done.context for a in reference]
    finally:
        engine.close()


def test_a_cut_step_leaves_no_error_in_the_log(small, capfd):
    """llama.cpp logs a cut step's rollback as errors: the runner drops them
    (the server's log shows real failures only)."""
    answer = EngineRun(small, PROMPTS[0], "batch", num_predict=10)
    while not answer.text:
        small.step()
    cuts = small.interrupt.cuts
    small.interrupt.request()
    small.step()
    small.interrupt.clear()
    assert small.interrupt.cuts == cuts + 1
    finish(small, answer)
    assert "failed to decode" not in capfd.readouterr().err
