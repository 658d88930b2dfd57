"""Structured output that always validates (issue 24, item 2), through both
APIs and in tool arguments: a byte-level model writing random bytes at
temperature 1, and every answer parses and passes ``jsonschema`` for its
maxLength / minLength / pattern / enum schema, with no replacement
character in it."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fuzz_depth import examples

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model

VALUES: list[dict[str, Any]] = [
    {"type": "string", "maxLength": 20},
    {"type": "string", "minLength": 5, "maxLength": 10},
    {"type": "string", "pattern": "^[a-zé😀]{2,6}$"},
    {"enum": ["café", "日本", "😀ok", "naïve"]},
]
SCHEMAS = [
    {
        "type": "object",
        "properties": {"value": value},
        "required": ["value"],
        "additionalProperties": False,
    }
    for value in VALUES
]
# 4 routes x 4 schemas x 7 seeds = 112 answers (13 seeds, 208, in the deep run)
SEEDS = range(examples(7, 13))
ASK = [{"role": "user", "content": "Give the value."}]


@pytest.fixture
def bytes_model(models_dir: Path, tmp_path: Path) -> str:
    from jupyter_llm.models.store import ModelStore

    spec = DemoModelSpec(
        uniform_bytes=True, chat_template=read_template("Qwen-Qwen2.5-7B-Instruct")
    )
    path = write_demo_model(tmp_path / "bytes.gguf", spec)
    store = ModelStore(models_dir)
    store.create("bytes", {"bytes.gguf": store.add_blob_from_file(path)})
    return "bytes"


def request(route: str, schema: dict[str, Any], seed: int) -> tuple[tuple[str, ...], dict]:
    if route == "ollama-chat":
        return ("api", "chat"), {"messages": ASK, "format": schema}
    if route == "ollama-generate":
        return ("api", "generate"), {"prompt": "Give the value.", "format": schema}
    openai = ("v1", "chat", "completions")
    if route == "openai":
        fmt = {"type": "json_schema", "json_schema": {"name": "value", "schema": schema}}
        return openai, {"messages": ASK, "response_format": fmt}
    tool = {"type": "function", "function": {"name": "put", "parameters": schema}}
    choice = {"type": "function", "function": {"name": "put"}}
    return openai, {"messages": ASK, "tools": [tool], "tool_choice": choice}


def answer(route: str, body: dict[str, Any]) -> tuple[str, str]:
    """The JSON text answered, and why the generation ended."""
    if route == "ollama-chat":
        return body["message"]["content"], body["done_reason"]
    if route == "ollama-generate":
        return body["response"], body["done_reason"]
    choice = body["choices"][0]
    if route == "openai":
        return choice["message"]["content"], choice["finish_reason"]
    (call,) = choice["message"]["tool_calls"]
    return call["function"]["arguments"], choice["finish_reason"]


ROUTES = ("ollama-chat", "ollama-generate", "openai", "openai-tool")


async def test_every_constrained_answer_validates(jp_fetch, bytes_model, capsys):
    invalid: list[tuple[str, Any, str, str]] = []
    counted: Counter[str] = Counter()

    async def one(route: str, i: int, seed: int) -> None:
        path, body = request(route, SCHEMAS[i], seed)
        options = {"temperature": 1.0, "seed": seed}
        if path[0] == "api":
            body = {**body, "options": {**options, "num_predict": 400}, "stream": False}
        else:
            body = {**body, **options, "max_tokens": 400}
        r = await jp_fetch("llm", *path, method="POST", body=json.dumps({"model": "bytes", **body}))
        text, reason = answer(route, json.loads(r.body))
        counted[route] += 1
        try:
            assert "\ufffd" not in text
            jsonschema.validate(json.loads(text), SCHEMAS[i])
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            invalid.append((route, VALUES[i], text, f"{reason}: {str(e)[:120]}"))

    jobs = [(route, i, seed) for seed in SEEDS for i in range(len(SCHEMAS)) for route in ROUTES]
    for start in range(0, len(jobs), 4):  # as many at once as the model has slots
        await asyncio.gather(*(one(*job) for job in jobs[start : start + 4]))
    with capsys.disabled():
        total = sum(counted.values())
        print(f"\n[structured] {total - len(invalid)} of {total} answers valid: {dict(counted)}")
    assert sum(counted.values()) == len(jobs)
    assert not invalid, invalid[:3]
