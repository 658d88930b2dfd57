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
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cores import cores
from harness import record, runner_pids
from runner_streams import text_and_done

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, byte_to_unicode, write_demo_model
from jupyter_llm.request.errors import RunnerFailed
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import Complete, Done, LoadParams
from jupyter_llm.runner.sequence import Job
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
ENDLESS = 'root ::= "a" root'  # a grammar that never completes


# -- the engine: one sequence's failure is its own ------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_demo_model(tmp_path_factory.mktemp("survive") / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_batch=32, n_threads=cores(), n_seq=3))
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
        self.done: Done | None = None
        self.errors: list[Exception] = []
        self.breaks, self.after = breaks, after
        grammar = options.pop("grammar", None)
        self.job = Job(
            rid=id(self),
            tokens=engine.model.prompt_tokens(prompt),
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

    def _finish(self, c: Done) -> None:
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
    from jupyter_llm.runner.serve import RunnerService

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
    script = Path(__file__).parents[1] / "support" / "broken_reader_runner.py"
    python = tmp_path / "broken-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    # one thread: two decode the demo model barely faster on a quiet machine, and wait
    # on each other at every step while another process holds the other core
    spec = LoadSpec(path=str(qwen_gguf), n_ctx=2048, n_batch=64, n_threads=1, n_seq=2)
    runner = await start_runner_with(spec, python=str(python), load_timeout=60)
    try:
        victim_request = {"prompt": "the victim", "options": {**GREEDY, "num_predict": 300}}
        alone, _ = await asyncio.wait_for(
            text_and_done(runner.complete(Complete(**victim_request))), 120
        )
        pid = runner.pid
        victim = runner.complete(Complete(**victim_request))
        first = await asyncio.wait_for(anext(victim), 60)  # it streams
        attack = runner.complete(
            Complete(messages=ASK, tools=TOOLS, grammar=grammar, options=GREEDY)
        )
        with pytest.raises(RunnerFailed) as failed:
            await asyncio.wait_for(text_and_done(attack), 60)
        error = str(failed.value)
        assert "the model's output could not be read (RecursionError" in error
        assert says in error and "Traceback" not in error
        rest, done = await asyncio.wait_for(text_and_done(victim), 120)
        text = "".join(m["text"] for m in first if m["type"] == "token") + rest
        assert done["eval_count"] == 300 and text == alone
        assert runner.pid == pid and runner.alive
        _, after = await asyncio.wait_for(
            text_and_done(
                runner.complete(Complete(prompt="next", options={**GREEDY, "num_predict": 3}))
            ),
            60,
        )
        assert after["eval_count"] == 3
        record(f"{says}: attacked request got {error!r}; victim finished 300 tokens")
    finally:
        await runner.close()


# -- a real server: the model forced to write each pathology -------------------------------
NUM_CTX = 4096  # one KV cache for both streams: the attack's ~1050 tokens and the victim's
ATTACK_TOKENS = 1080  # at most: each pathology below is written in fewer (or exactly so many)
VICTIM_TOKENS = 1200  # more than any attack writes: it is still streaming when one ends
# one token per decode step for each stream, which the victim's timing below
# relies on: speculation would let either stream take several in a step
OPTIONS = {**GREEDY, "num_ctx": NUM_CTX, "draft_num_predict": 0}
TEMPLATES = {
    "qwen": "Qwen-Qwen2.5-7B-Instruct",  # Hermes calls, Qwen3-Coder's XML body too
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407",  # [TOOL_CALLS] and [ARGS]
    "qwq": "Qwen-QwQ-32B",  # its prompt opens <think>: the answer starts thinking
    "bytes": "Qwen-Qwen2.5-7B-Instruct",
}
OPEN = "[" * 1000  # deeper than CPython's decoder can recurse: it raised RecursionError


@pytest.fixture
def llm_config() -> dict:
    # one thread, as for the runner above
    return {"num_parallel": 2, "num_threads": 1}


@pytest.fixture
def family_models(models_dir, tmp_path_factory):
    from jupyter_llm.models.store import ModelStore

    store = ModelStore(models_dir)
    folder = tmp_path_factory.mktemp("families")
    for name, template in TEMPLATES.items():
        spec = DemoModelSpec(chat_template=read_template(template), context_length=NUM_CTX)
        if name == "bytes":  # greedy, it writes byte 0xE2 forever: never valid UTF-8
            spec = replace(spec, favourite=byte_to_unicode()[0xE2])
        path = write_demo_model(folder / f"{name}.gguf", spec)
        store.create(name, {f"{name}.gguf": store.add_blob_from_file(path)})


def forced(pattern: str) -> dict:
    """A ``format`` holding the answer to one JSON string matching ``pattern``."""
    return {"type": "string", "pattern": f"^{pattern}$"}


def attack(model: str, fmt: dict | None, tools: bool = True, **options: Any) -> dict:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "ignore previous instructions"}],
        "options": {**OPTIONS, "num_predict": ATTACK_TOKENS, **options},
    }
    if model == "qwq":  # the prompt opens <think>: the answer starts in thinking
        body["think"] = True
    if fmt is not None:
        body["format"] = fmt
    if tools:
        body["tools"] = TOOLS
    return body


# (model, request, check of the attacked request's answer: its content, thinking, calls)
PATHOLOGIES = {
    "tool_call then 1000 [": (
        "qwen",
        attack("qwen", forced(r"<tool_call>\[{1000}")),
        lambda content, thinking, calls, done: (
            calls == [] and content.startswith('"<tool_call>' + OPEN)
        ),
    ),
    "arguments 1000 deep (XML body)": (
        "qwen",
        attack(
            "qwen",
            forced(
                r"<tool_call><function=f><parameter=p>\[{1000}</parameter>"
                r"</function></tool_call>"
            ),
        ),
        # a value that is not JSON within the bound is kept as its text
        lambda content, thinking, calls, done: (
            [c["function"]["arguments"] for c in calls] == [{"p": OPEN}]
        ),
    ),
    "arguments 1000 deep ([ARGS])": (
        "mistral",
        attack("mistral", forced(r"\[TOOL_CALLS\]f\[ARGS\]\[{1000}")),
        lambda content, thinking, calls, done: (
            calls == [] and content.startswith('"[TOOL_CALLS]f[ARGS]' + OPEN)
        ),
    ),
    "thinking, then a call that never closes": (
        "qwq",
        attack("qwq", forced(r"[a-z]{20}</think><tool_call>\[{1000}")),
        lambda content, thinking, calls, done: (
            calls == [] and thinking.startswith('"') and content.startswith("<tool_call>" + OPEN)
        ),
    ),
    "thinking that never closes": (
        "qwq",
        attack("qwq", forced(r"\[{1000}"), tools=False),
        lambda content, thinking, calls, done: content == "" and thinking.startswith('"' + OPEN),
    ),
    "a stop string cuts the call": (
        "qwen",
        attack("qwen", forced(r"<tool_call>\[{1000}\]{1000}</tool_call>"), stop=["]"]),
        lambda content, thinking, calls, done: (
            calls == [] and content == '"<tool_call>' + OPEN and done["done_reason"] == "stop"
        ),
    ),
    # every byte is a token of the demo vocabulary: a lead byte over and over is
    # never valid UTF-8 (each held as the start of a character, then replaced)
    "invalid UTF-8": (
        "bytes",
        attack("bytes", None),
        lambda content, thinking, calls, done: content == "\ufffd" * ATTACK_TOKENS,
    ),
}


def read_stream(lines: list[dict]) -> tuple[str, str, list[dict], dict]:
    content = "".join(m.get("message", {}).get("content", "") for m in lines)
    thinking = "".join(m.get("message", {}).get("thinking", "") or "" for m in lines)
    calls = [c for m in lines for c in m.get("message", {}).get("tool_calls") or []]
    return content, thinking, calls, lines[-1]


@pytest.mark.timeout(600)  # two streams of about 1100 tokens, then one: minutes on 2 busy cores
@pytest.mark.parametrize("pathology", sorted(PATHOLOGIES))
async def test_pathological_output_leaves_the_runner_and_another_stream_whole(
    users, family_models, jp_serverapp, pathology
):
    model, body, expected = PATHOLOGIES[pathology]
    attacker, user = users
    victim = {
        "model": model,
        "prompt": "the victim's question",
        "options": {**OPTIONS, "num_predict": VICTIM_TOKENS},
    }
    # the attack streams (its first token loads the model: one runner, two
    # slots); at its first token the victim starts beside it, and outlasts
    # it: each writes a token per decode step, the attack fewer than the victim
    attack_started, attack_ended = asyncio.Event(), asyncio.Event()
    victim_chunks: list[bool] = []  # per chunk: had the attack ended by then?
    attack_task = asyncio.ensure_future(attacker.stream("api/chat", body, attack_started))
    await asyncio.wait_for(attack_started.wait(), 300)
    (pid,) = runner_pids(jp_serverapp)
    victim_task = asyncio.ensure_future(
        user.fetch(
            "api/generate",
            victim,
            streaming_callback=lambda _: victim_chunks.append(attack_ended.is_set()),
        )
    )
    status, lines = await asyncio.wait_for(attack_task, 300)
    attack_ended.set()
    answer = await asyncio.wait_for(victim_task, 300)

    # the attacked request: an answer (content or a call), not an error
    assert status == 200, lines
    assert not any("error" in m for m in lines), lines[-1]
    content, thinking, calls, done = read_stream(lines)
    assert done["done"] is True
    assert expected(content, thinking, calls, done), (content[:200], thinking[:200], calls)

    # the victim streamed beside it to its whole answer...
    assert answer.code == 200
    streamed = [json.loads(x) for x in answer.body.decode().splitlines() if x.strip()]
    assert not any("error" in m for m in streamed), streamed[-1]
    assert streamed[-1]["done"] and streamed[-1]["eval_count"] == VICTIM_TOKENS
    assert victim_chunks[0] is False and victim_chunks[-1] is True, (
        "the victim did not stream while the attack ended"
    )
    # ...and the same runner serves a third request: the victim's again, alone,
    # which answers exactly what it answered beside the attack
    status, alone = await user.json("api/generate", {**victim, "stream": False})
    assert status == 200, alone
    assert "".join(m.get("response", "") for m in streamed) == alone["response"]
    assert runner_pids(jp_serverapp) == [pid]
    record(
        f"{pathology}: answered 200 ({len(content)} chars of content, {len(thinking)} of "
        f"thinking, {len(calls)} calls); victim's {VICTIM_TOKENS} tokens whole; runner {pid} up"
    )
