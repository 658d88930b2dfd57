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


def test_a_recurrent_model_never_has_a_step_cut(tmp_path):
    """A recurrent state advances as a step begins and llama.cpp cannot take
    it back: a cut step run again failed every sequence in it ("positions
    remain consecutive"). Such a runner's steps are never armed, and batch
    work with interactive arrivals ends as it does without them."""
    from mamba_gguf import write_mamba

    engine = Engine(LoadParams(path=str(write_mamba(tmp_path / "mamba.gguf")), n_ctx=512, n_seq=2))
    try:
        assert not engine.interrupt.available
        reference = EngineRun(engine, PROMPTS[0], "batch", num_predict=20)
        finish(engine, reference)
        answer = EngineRun(engine, PROMPTS[0], "batch", num_predict=20)
        while answer.done is None and not answer.errors:
            engine.interrupt.request()  # interactive work arrives before every step
            engine.step()
        engine.interrupt.clear()
        assert answer.errors == [] and engine.interrupt.cuts == 0
        assert answer.done.context == reference.done.context
    finally:
        engine.close()


def test_an_image_is_decoded_with_no_step_armed(tmp_path):
    """mtmd decodes an image on the same context: a callback left armed by
    the previous batch-only step cut it, and mtmd's helper turned the cut
    into a failed request, interactive or not."""
    import io

    from PIL import Image

    from jupyter_llm.demo import write_vision_model
    from jupyter_llm.runner.sequence import Job
    from jupyter_llm.runner.vision import split_plain

    model, projector = write_vision_model(tmp_path, "tiny-vision")
    params = LoadParams(path=str(model), projector=str(projector), n_ctx=1024, n_seq=2)
    engine = Engine(params)
    try:
        batch = EngineRun(engine, PROMPTS[0], "batch", num_predict=200)
        while not batch.text:
            engine.step()
        engine.step()  # a batch-only step: armed, and left so
        image = io.BytesIO()
        Image.new("RGB", (24, 24), (200, 30, 90)).save(image, "PNG")
        parts = split_plain("describe", engine.model.image_marker, [image.getvalue()])
        media = engine.model.image_prompt(parts, None, engine.n_batch)
        errors: list[Exception] = []
        done: list[Any] = []
        job = Job(
            rid=7,
            tokens=media.tokens,
            options={"temperature": 0, "num_predict": 4},
            emit=lambda piece: None,
            finish=done.append,
            fail=errors.append,
            priority="interactive",
        )
        job.images, job.release = media.images, media.close
        engine.submit(job)
        while not done and not errors:
            engine.interrupt.request()  # interactive work arrives while the image decodes
            engine.step()
        engine.interrupt.clear()
        assert errors == [] and done
        finish(engine, batch)
    finally:
        engine.close()
