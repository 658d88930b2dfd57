"""One job submitted to an in-process runner ``Engine``, and what came back:
for the runner tests that drive ``Engine.step`` themselves (batching with
priorities, pauses, cut steps, drafts)."""

from __future__ import annotations

from typing import Any

from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import Done
from jupyter_llm.runner.sequence import Job

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


class EngineRun:
    """``prompt`` submitted at once, greedy unless ``options`` say otherwise;
    ``grammar`` and ``logprobs`` go to the job, the rest to its options. A
    failure is recorded in ``errors`` (the engine swallows what its callbacks
    raise)."""

    def __init__(
        self, engine: Engine, prompt: str, priority: str = "interactive", **options: Any
    ) -> None:
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.done: Done | None = None
        self.errors: list[Exception] = []
        grammar = options.pop("grammar", None)
        logprobs = options.pop("logprobs", -1)
        self.job = Job(
            rid=id(self),
            tokens=engine.model.prompt_tokens(prompt),
            options={**GREEDY, **options},
            emit=self.text.append,
            finish=self._finish,
            fail=self.errors.append,
            grammar=grammar,
            logprobs=logprobs,
            on_logprob=self.logprobs.append,
            priority=priority,
        )
        engine.submit(self.job)

    def _finish(self, done: Done) -> None:
        self.done = done

    @property
    def ended(self) -> bool:
        return self.done is not None or bool(self.errors)

    @property
    def output(self) -> str:
        return "".join(self.text)

    @property
    def tokens(self) -> list[int]:
        """The whole context at the end: prompt and answer."""
        assert self.done is not None, self.errors
        return self.done.context

    def slot(self, engine: Engine) -> Any:
        """The slot holding this job's sequence."""
        return next(s for s in engine.slots if s.seq is not None and s.seq.job is self.job)


def finish(engine: Engine, *runs: EngineRun) -> None:
    """Step until every run ended; none may have failed."""
    while not all(r.ended for r in runs):
        engine.step()
    for r in runs:
        assert not r.errors, r.errors
