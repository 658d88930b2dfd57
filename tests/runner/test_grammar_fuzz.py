"""Constrained generation at temperature 1 through a real runner process
(issue 24): lazy tool-call triggers, forced and named calls, a format, and
a format beside tools, on Gemma with a tool template and on a byte-level
model writing random bytes. Whatever the model writes, the runner lives:
a request ends with its answer or its own error, and every call made is
valid for its tool's schema."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cores import cores
from fuzz_depth import TIMEOUT, examples
from test_runner_tools import SCHEMAS, TOOLS, WEATHER, calls_of, run, text_of

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.grammar.json_schema import schema_to_grammar
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.process import InvalidRequest
from jupyter_llm.runner_client.proxy import start_runner_with

ASKS = [
    [{"role": "user", "content": "Weather in Paris for 3 days?"}],
    [{"role": "user", "content": "What time is it in UTC? Use a tool."}],
    [{"role": "user", "content": "Say hello, then call get_weather for Oslo."}],
]
PATHS: dict[str, dict[str, Any]] = {
    "auto": {"tools": TOOLS, "tool_choice": "auto"},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"name": "get_time"}},
    "format": {"grammar": schema_to_grammar(WEATHER)},
    "format+tools": {"tools": TOOLS, "tool_choice": "auto", "grammar": schema_to_grammar(WEATHER)},
}


async def fuzz(runner: Any, runs: int, num_predict: int, parallel: int) -> Counter[str]:
    """``runs`` requests at temperature 1 over ``PATHS``, ``parallel`` at a
    time; the outcome of each, counted."""
    outcomes: Counter[str] = Counter()
    names = sorted(PATHS)

    async def one(i: int) -> None:
        path = names[i % len(names)]
        request = {
            "messages": ASKS[i % len(ASKS)],
            "options": {"temperature": 1.0, "seed": i, "num_predict": num_predict},
            **PATHS[path],
        }
        try:
            seen = await run(runner, wait=120, **request)
        except InvalidRequest as e:  # the request's own error: the runner goes on
            outcomes[f"{path}: refused ({str(e)[:60]})"] += 1
            return
        done = seen[-1]
        assert done["type"] == "done"
        for call in calls_of(seen):
            jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
        if path in ("required", "named") and done["done_reason"] != "length":
            assert calls_of(seen), (path, text_of(seen))
        if path == "format" and done["done_reason"] == "stop":
            jsonschema.validate(json.loads(text_of(seen)), WEATHER)
        kind = "call" if calls_of(seen) else "text"
        outcomes[f"{path}: {kind}, {done['done_reason']}"] += 1

    for start in range(0, runs, parallel):
        await asyncio.gather(*(one(i) for i in range(start, min(runs, start + parallel))))
    assert await runner.health()  # alive and answering
    return outcomes


def report(capsys: pytest.CaptureFixture[str], name: str, outcomes: Counter[str]) -> None:
    with capsys.disabled():
        print(f"\n[grammar fuzz, {name}] {sum(outcomes.values())} runs:")
        for outcome, n in sorted(outcomes.items()):
            print(f"  {n:4d}  {outcome}")


@pytest.mark.timeout(TIMEOUT)
async def test_byte_level_model_at_temperature_1(tmp_path_factory, capsys):
    spec = DemoModelSpec(
        uniform_bytes=True, chat_template=read_template("Qwen-Qwen2.5-7B-Instruct")
    )
    path: Path = write_demo_model(tmp_path_factory.mktemp("fuzz") / "bytes.gguf", spec)
    # one thread: on a quiet machine two decode a model this small barely faster (20
    # runs in 1.7-1.9 s against 2.1-2.8 s), but when another process holds a core the
    # two wait on each other at every step (20 runs in 17.6-27.6 s against 2.3-9.6 s)
    runner = await start_runner_with(
        LoadSpec(path=str(path), n_ctx=4096, n_batch=256, n_threads=1, n_seq=4), load_timeout=60
    )
    try:
        outcomes = await fuzz(runner, runs=examples(40, 200), num_predict=200, parallel=4)
    finally:
        await runner.close()
    report(capsys, "byte-level", outcomes)


@pytest.mark.timeout(600)  # a 270M model on two busy cores: a hang, not slowness, should fail it
async def test_gemma_with_a_tool_template_at_temperature_1(gemma_tools_gguf, capsys):
    runner = await start_runner_with(
        LoadSpec(path=str(gemma_tools_gguf), n_ctx=4096, n_threads=cores(), n_seq=2),
        load_timeout=120,
    )
    try:
        outcomes = await fuzz(runner, runs=examples(6, 12), num_predict=32, parallel=2)
    finally:
        await runner.close()
    report(capsys, "gemma", outcomes)
