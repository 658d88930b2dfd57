"""Attack 2: a model answer of ``<tool_call>`` and 1000 ``[`` (forced with
``format``; a prompt injection gets the same) raised RecursionError in the
tool-call reader inside the runner's decode step: the runner died, and
another user's stream on that model ended with the same error.

Now the readers bound what they parse (``tool_calls.MAX_NESTING``), so
pathological output comes back as content; and whatever still fails in one
sequence's output work (a reader, its replies) ends that request alone with
the error, its slot and KV cells freed, while the others stream on and the
runner stays up. Shown at three levels: the engine in process (failures
planted in a job's callbacks), a real runner process whose reader has a
planted bug, and a real server whose model is forced (``format``) to write
each pathology while another user's stream runs on the same runner.

Nothing here waits on time: each step acts on what was observed (a first
token, an answer), and the victim's answer is compared with its own
baseline taken alone in the same test."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import record

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.errors import RunnerFailed
from jupyter_llm.runner.engine import Engine, LoadParams
from jupyter_llm.runner.launch import LoadSpec
from jupyter_llm.runner.proxy import start_runner_with
from jupyter_llm.runner.sequence import Completion, Job

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
ENDLESS = 'root ::= "a" root'  # a grammar that never completes


# -- the engine: one sequence's failure is its own ------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_demo_model(tmp_path_factory.mktemp("survive") / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_batch=32, n_threads=2, n_seq=3))
    yield engine
    engine.close()


class Planted(Exception):
    """What a planted failure raises (a reader's bug)."""


class Run:
    """One submitted job; ``breaks`` names the callback that raises once the
    job has seen ``after`` pieces of text ("emit", "finish", "fail", or both
    of "emit+fail")."""

    def __init__(
        self, engine: Engine, prompt: str, breaks: str = "", after: int = 3, **options: Any
    ) -> None:
        self.text: list[str] = []
        self.done: Completion | None = None
        self.errors: list[Exception] = []
        self.breaks, self.after = breaks, after
        grammar = options.pop("grammar", None)
        self.job = Job(
            rid=id(self),
            tokens=engine.prompt_tokens(prompt),
            options={**GREEDY, **options},
            emit=self._emit,
            finish=self._finish,
            fail=self._fail,
            grammar=grammar,
        )
        engine.submit(self.job)

    def _emit(self, text: str) -> None:
        if "emit" in self.breaks and len(self.text) >= self.after:
            raise RecursionError("maximum recursion depth exceeded (planted)")
        self.text.append(text)

    def _finish(self, c: Completion) -> None:
        if "finish" in self.breaks:
            raise Planted("the reader failed at the end")
        self.done = c

    def _fail(self, e: Exception) -> None:
        self.errors.append(e)
        if "fail" in self.breaks:
            raise Planted("and telling it failed too")

    @property
    def output(self) -> str:
        return "".join(self.text)


def drain(engine: Engine, limit: int = 10_000) -> None:
    steps = 0
    while engine.busy:
        engine.step()  # raises if anything escapes the step loop
        steps += 1
        assert steps < limit


@pytest.mark.parametrize("breaks", ["emit", "finish", "emit+fail", "finish+fail"])
def test_a_sequence_whose_output_work_fails_ends_alone(engine, breaks):
    alone = Run(engine, "the victim's question", num_predict=40)
    drain(engine)
    victim = Run(engine, "the victim's question", num_predict=40)
    engine.step()  # the victim's prompt: it streams before the attack comes
    engine.step()
    assert victim.text
    attacked = Run(engine, "go", breaks=breaks, grammar=ENDLESS, num_predict=12)
    drain(engine)
    # the attacked request ended with its error (once), whatever failed after it
    assert attacked.done is None
    assert len(attacked.errors) == 1
    assert isinstance(attacked.errors[0], RecursionError | Planted)
    # the other one streamed on to its full answer, the same as alone
    assert victim.errors == [] and victim.done is not None
    assert victim.done.eval_count == 40 and victim.output == alone.output
    # nothing of the attacked request is left in the engine
    assert all(s.seq is None for s in engine.slots) and not engine.waiting
    if breaks.startswith("emit"):  # failed in its slot: its cells were freed
        assert not any(s.cached[:1] == attacked.job.tokens[:1] for s in engine.slots)
    after = Run(engine, "and the next request", num_predict=5)
    drain(engine)
    assert after.done is not None and after.done.eval_count == 5


def test_a_failure_no_sequence_owns_ends_the_completions_and_the_loop_goes_on(engine):
    """The service's step: a bug outside any sequence's work fails the
    completions in flight, frees their slots, and the next step serves."""
    from jupyter_llm.runner.service import RunnerService

    service = RunnerService.__new__(RunnerService)  # no socket: only ``step`` is used
    service.engine = engine
    runs = [Run(engine, f"request {i}", num_predict=50) for i in range(2)]
    real = engine._assign

    def broken() -> None:
        raise Planted("a bug in the engine's bookkeeping")

    engine._assign = broken  # type: ignore[method-assign]
    try:
        service.step()
    finally:
        engine._assign = real  # type: ignore[method-assign]
    assert [len(r.errors) for r in runs] == [1, 1]
    assert all(s.seq is None for s in engine.slots) and not engine.busy
    after = Run(engine, "and the next request", num_predict=5)
    drain(engine)
    assert after.done is not None and after.done.eval_count == 5


# -- a real runner whose reader has a bug --------------------------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "description": "a tool",
            "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "call the tool"}]


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with Qwen 2.5's template (Hermes tool calls)."""
    spec = DemoModelSpec(
        chat_template=read_template("Qwen-Qwen2.5-7B-Instruct"), context_length=8192
    )
    return write_demo_model(tmp_path_factory.mktemp("qwen") / "qwen.gguf", spec)


async def answer(stream: Any) -> tuple[str, dict[str, Any]]:
    text = []
    async for batch in stream:
        for message in batch:
            if message["type"] == "token":
                text.append(message["text"])
            elif message["type"] == "done":
                return "".join(text), message
    raise AssertionError("no done message")


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        ('root ::= "BOOM" [a-z]{20}', "planted in the reader"),
        ('root ::= "FINISH" [a-z]{20}', "planted at the end"),
    ],
    ids=["while streaming", "at the end"],
)
async def test_a_reader_bug_in_a_real_runner_ends_that_request_only(
    tmp_path, qwen_gguf, grammar, says
):
    script = Path(__file__).with_name("broken_reader_runner.py")
    python = tmp_path / "broken-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    spec = LoadSpec(path=str(qwen_gguf), n_ctx=2048, n_batch=64, n_threads=2, n_seq=2)
    runner = await start_runner_with(spec, python=str(python), load_timeout=60)
    try:
        victim_request = {"prompt": "the victim", "options": {**GREEDY, "num_predict": 300}}
        alone, _ = await asyncio.wait_for(answer(runner.complete(**victim_request)), 120)
        pid = runner.pid
        victim = runner.complete(**victim_request)
        first = await asyncio.wait_for(anext(victim), 60)  # it streams
        attack = runner.complete(messages=ASK, tools=TOOLS, grammar=grammar, options=GREEDY)
        with pytest.raises(RunnerFailed) as failed:
            await asyncio.wait_for(answer(attack), 60)
        error = str(failed.value)
        assert "the model's output could not be read (RecursionError" in error
        assert says in error and "Traceback" not in error
        rest, done = await asyncio.wait_for(answer(victim), 120)
        text = "".join(m["text"] for m in first if m["type"] == "token") + rest
        assert done["eval_count"] == 300 and text == alone
        assert runner.pid == pid and runner.alive
        _, after = await asyncio.wait_for(
            answer(runner.complete(prompt="next", options={**GREEDY, "num_predict": 3})), 60
        )
        assert after["eval_count"] == 3
        record(f"{says}: attacked request got {error!r}; victim finished 300 tokens")
    finally:
        await runner.close()
