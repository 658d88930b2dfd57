"""Sampling under a grammar (issue 24): no token reaches llama.cpp's grammar
before the grammar has allowed it (a refused token there throws a C++
exception, which aborts the runner), lazy triggers are watched by the
runner, and constrained output is UTF-8 whose length Python counts as the
grammar did. Engine tests run in process and act on what was generated."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cores import cores

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.grammar.gbnf import literal
from jupyter_llm.grammar.json_schema import schema_to_grammar
from jupyter_llm.runner.constrained import (
    TRIGGER_LOOKBACK,
    Triggers,
    compile_triggers,
    trigger_start,
)
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import Done, EngineError, LoadParams
from jupyter_llm.runner.sequence import Job

# -- pure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "output", "new", "expected"),
    [
        ((r"<tool_call>",), b"Sure. <tool_call>", 1, 6),
        ((r"<tool_call>",), b"Sure. <tool_call", 4, None),
        ((r"<tool_call>",), b"a<tool_call></", 3, 1),  # fed from the match, tail and all
        ((r"^\s*(\{[\s\S]*)$",), b'  {"a"', 2, 2),  # from the group
        ((r"^\s*(\{[\s\S]*)$",), b'x {"a"', 2, None),  # the whole output must match
        ((r"to=(f)\.x", r"(<b>)"), b"zz<b>", 3, 2),  # the first pattern that matches
        ((r"(a)?(b)",), b"xb", 1, 1),  # the first group that matched something
    ],
)
def test_trigger_start(patterns, output, new, expected):
    assert trigger_start(compile_triggers(patterns), output, new) == expected


def test_a_trigger_is_sought_near_the_end_only():
    far = b"<b>" + b"x" * 10_000
    assert trigger_start(compile_triggers((r"<b>",)), far, 1) is None


def test_a_trigger_of_the_whole_output_is_watched_for_its_first_4_kib():
    # it would have matched before: a model that has not begun by then answers in text
    whole = compile_triggers((r"^\s*(\{[\s\S]*)$",))
    assert trigger_start(whole, b" " * (TRIGGER_LOOKBACK - 1) + b"{", 1) == TRIGGER_LOOKBACK - 1
    assert trigger_start(whole, b" " * TRIGGER_LOOKBACK + b"{", 1) is None
    # its cost stays that of 4 KiB however long the blanks (13 ms a token at 1 MB)
    assert trigger_start(whole, b" " * (4 << 20) + b"{", 1) is None


def test_a_trigger_that_does_not_compile_is_refused():
    with pytest.raises(EngineError, match="invalid trigger pattern"):
        compile_triggers(("(unclosed",))


# -- in process ---------------------------------------------------------------


def generate(engine: Engine, prompt: str, **job: Any) -> tuple[str, Done]:
    text: list[str] = []
    done: list[Done] = []
    errors: list[Exception] = []
    engine.submit(
        Job(
            rid=1,
            tokens=engine.model.prompt_tokens(prompt),
            options=job.pop("options"),
            emit=text.append,
            finish=done.append,
            fail=errors.append,
            **job,
        )
    )
    while not done and not errors:
        engine.step()
    assert not errors, errors
    return "".join(text), done[0]


GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path):
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=1024, n_threads=cores(), n_seq=1))
    yield engine
    engine.close()


def test_a_trigger_completed_inside_a_token_is_checked_before_the_token_is_taken(gemma):
    # Gemma completes "<tool_call" with its one token "></"; llama.cpp's lazy
    # grammar fed that token's tail "</" threw and aborted the runner. Here a
    # trigger is made to end inside a token Gemma really writes, and the
    # grammar refuses the rest of that token.
    prompt = "Write one sentence about the sea."
    free, done = generate(gemma, prompt, options={**GREEDY, "num_predict": 24})
    tokens = done.context[len(gemma.model.prompt_tokens(prompt)) :]
    pieces = [gemma.model.token_text(t) for t in tokens]
    at = next(i for i in range(1, len(pieces)) if re.fullmatch(r"\s?[A-Za-z]{4,}", pieces[i]))
    before = "".join(pieces[:at])
    trigger = (before + pieces[at][:-2])[-8:]
    assert free.find(trigger) == len(before) + len(pieces[at]) - 2 - len(trigger)
    lazy = f'root ::= {literal(trigger)} "!forced!"'
    text, done = generate(
        gemma,
        prompt,
        options={**GREEDY, "num_predict": 40},
        grammar=lazy,
        triggers=Triggers(patterns=(re.escape(trigger),)),
    )
    assert not text.startswith(before + pieces[at])  # the token was left out
    if trigger in text:  # another token fired it, and the grammar held from there
        assert text.endswith(trigger + "!forced!")
        assert done.done_reason == "stop"


def test_a_refused_token_is_sampled_again_under_the_grammar(gemma):
    # greedy free text starts with a letter; the grammar wants digits: the
    # first pick is refused and the pick under the grammar is a digit
    text, done = generate(
        gemma,
        "Name a colour.",
        options={**GREEDY, "num_predict": 8},
        grammar='root ::= [0-9]{3} "."',
    )
    assert re.fullmatch(r"[0-9]{3}\.", text), text
    assert done.done_reason == "stop"


# -- a byte-level vocabulary at temperature 1 -----------------------------------

SCHEMAS: list[dict[str, Any]] = [
    {"type": "string", "maxLength": 20},
    {"type": "string", "minLength": 3, "maxLength": 8},
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    },
    {"type": "string", "pattern": "^[a-zé€😀]{2,6}$"},
    {"enum": ["café", "naïve", "日本", "😀ok", 3]},
    {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
]


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory):
    spec = DemoModelSpec(uniform_bytes=True)  # random bytes, most not UTF-8 alone
    path = write_demo_model(tmp_path_factory.mktemp("utf8") / "m.gguf", spec)
    engine = Engine(LoadParams(path=str(path), n_ctx=4096, n_batch=256, n_threads=cores(), n_seq=4))
    yield engine
    engine.close()


def test_constrained_strings_are_utf8_and_their_length_is_pythons(byte_level, capsys):
    """240 generations at temperature 1, four at a time: every one parses
    and validates, and no replacement character appears."""
    results: dict[int, tuple[list[str], list[Done], list[Exception]]] = {}
    grammars = [schema_to_grammar(s) for s in SCHEMAS]
    runs = [(seed, i) for seed in range(40) for i in range(len(SCHEMAS))]
    pending = list(runs)
    while pending or any(not d and not e for _, d, e in results.values()):
        while pending and len(byte_level.waiting) < 4:
            seed, i = pending.pop()
            out: tuple[list[str], list[Done], list[Exception]] = ([], [], [])
            results[seed * 100 + i] = out
            byte_level.submit(
                Job(
                    rid=seed * 100 + i,
                    tokens=byte_level.model.prompt_tokens(f"Answer {seed}:"),
                    options={"temperature": 1.0, "seed": seed, "num_predict": 600},
                    emit=out[0].append,
                    finish=out[1].append,
                    fail=out[2].append,
                    grammar=grammars[i],
                )
            )
        byte_level.step()
    invalid = []
    for rid, (text, done, errors) in results.items():
        schema = SCHEMAS[rid % 100]
        assert not errors, errors
        assert done[0].done_reason == "stop", (schema, "".join(text))
        output = "".join(text)
        try:
            assert "\ufffd" not in output
            jsonschema.validate(json.loads(output), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            invalid.append((schema, output, str(e)[:200]))
    with capsys.disabled():
        print(f"\n[utf8] {len(results) - len(invalid)} of {len(results)} constrained outputs valid")
    assert not invalid, invalid[:3]
