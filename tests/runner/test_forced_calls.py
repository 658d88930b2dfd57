"""Forced tool calls that close within a normal client's budget, and calls
the token limit cut short that never reach the content (issue 24, item 4).

A forced call's wrapper let a model pad at every gap (``[ \\t\\n]{0,8}``),
so a byte-level random model spent ``max_tokens`` 200 on blanks; the call
that never closed was then sent as content, markup and all, with
``finish_reason: "length"``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grammar_probe import GrammarProbe
from test_runner_tools import calls_of, run

from jupyter_llm.chat_formats import detect_format, parse_output, read_template
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
)
from jupyter_llm.chat_formats.tool_grammar import tool_grammar
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

QWEN = "Qwen-Qwen2.5-7B-Instruct"


def weather(argument: dict[str, Any]) -> dict[str, Any]:
    """One tool with one argument, as an agent framework sends it."""
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"location": argument},
                "required": ["location"],
            },
        },
    }


TOOL = weather({"type": "string", "maxLength": 20})
ARGS = {"location": "Oslo"}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def fmt(template: str):
    return detect_format(read_template(template))


# -- the grammar: whitespace is bounded ---------------------------------------


@pytest.fixture(scope="module")
def probe(demo_gguf: Path):
    p = GrammarProbe(demo_gguf)
    yield p
    p.close()


CALL = '{"name": "get_weather", "arguments": {"location": "Oslo"}}'
COMPACT = '{"name":"get_weather","arguments":{"location":"Oslo"}}'


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (f"<tool_call>\n{CALL}\n</tool_call>", True),  # as Qwen's template writes it
        (f"<tool_call>{COMPACT}</tool_call>", True),
        (f"<tool_call> \n{CALL} \n</tool_call>", True),  # two blanks around a marker
        (f"<tool_call>\n\n\n{CALL}\n</tool_call>", False),  # three
        (f"<tool_call>\n{CALL}\n\n\n</tool_call>", False),
        (f"<tool_call>\t{CALL}\n</tool_call>", False),  # no tabs
        ("<tool_call>" + CALL.replace(": ", "  : ", 1) + "</tool_call>", False),  # two spaces
        ("<tool_call>" + CALL.replace(": ", ":\n", 1) + "</tool_call>", False),  # a newline
        ("<tool_call>" + CALL.replace(", ", ",  ", 1) + "</tool_call>", False),
        # the arguments' own whitespace is the JSON grammar's: one space at most
        ("<tool_call>" + CALL.replace(': "Oslo', ':  "Oslo') + "</tool_call>", False),
    ],
)
def test_a_forced_calls_whitespace_is_bounded(probe, text, ok):
    grammar = tool_grammar(fmt(QWEN), [TOOL], "required").grammar
    assert probe.accepts(grammar, text) is ok


def test_thinking_then_a_call_keeps_the_templates_blank_lines(probe):
    grammar = tool_grammar(fmt("Qwen-Qwen3-0.6B"), [TOOL], "required").grammar
    call = f"<tool_call>\n{CALL}\n</tool_call>"
    assert probe.accepts(grammar, f"<think>\nhm\n</think>\n\n{call}")
    assert not probe.accepts(grammar, f"<think>\nhm\n</think>\n\n\n{call}")


def test_parallel_calls_are_separated_by_a_bounded_gap(probe):
    grammar = tool_grammar(fmt(QWEN), [TOOL], "required", parallel=True).grammar
    one = f"<tool_call>\n{CALL}\n</tool_call>"
    assert probe.accepts(grammar, f"{one}\n{one}")
    assert not probe.accepts(grammar, f"{one}\n\n\n{one}")


# -- the reader: a call cut short is not content --------------------------------

THINK = "<think>\nlet me see\n</think>\n\n"
FORCED = {  # what a forced call looks like in each format, whole
    "hermes": (QWEN, f"<tool_call>\n{CALL}\n</tool_call>"),
    "qwen3": ("Qwen-Qwen3-0.6B", f"{THINK}<tool_call>\n{CALL}\n</tool_call>"),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct", CALL.replace("arguments", "parameters")),
    "llama3_tag": (
        "meta-llama-Llama-3.1-8B-Instruct",
        "<|python_tag|>" + CALL.replace("arguments", "parameters"),
    ),
    "mistral": ("mistralai-Mistral-Nemo-Instruct-2407", f"[TOOL_CALLS][{CALL}]"),
    "mistral_args": (
        "Mistral-Small-3.2-24B-Instruct-2506",
        '[TOOL_CALLS]get_weather[ARGS]{"location": "Oslo"}',
    ),
    "deepseek_r1": (
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        f"{THINK}{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}function{DEEPSEEK_SEP}get_weather\n"
        f'```json\n{{"location": "Oslo"}}\n```{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}',
    ),
    "gpt_oss": (  # the runner stops at <|call|> without showing it
        "openai-gpt-oss-120b",
        "<|channel|>analysis<|message|>let me see<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location": "Oslo"}',
    ),
}


def read(template: str, text: str, **kw: Any):
    return parse_output(
        text, fmt(template), tools=True, tool_names=["get_weather"], constrained=True, **kw
    )


@pytest.mark.parametrize("family", sorted(FORCED))
def test_a_forced_call_cut_anywhere_leaves_no_markup(family):
    template, whole = FORCED[family]
    for end in range(len(whole) + 1):
        out = read(template, whole[:end], cut_off=True)
        assert out.content == "", (whole[:end], out)
        assert out.tool_calls in ([], out.tool_calls[:1]) and len(out.tool_calls) <= 1
        if out.tool_calls:  # only once the arguments are whole
            assert out.tool_calls[0].name == "get_weather"
            assert out.tool_calls[0].arguments == ARGS
    (call,) = read(template, whole, cut_off=True).tool_calls  # cut just as it closed
    assert (call.name, call.arguments) == ("get_weather", ARGS)
    (call,) = read(template, whole).tool_calls
    assert (call.name, call.arguments) == ("get_weather", ARGS)


def test_a_call_that_stopped_unclosed_is_still_content():
    """The model ended it (not the limit): what it wrote is its answer, as before."""
    half = f"<tool_call>\n{CALL[:20]}"
    assert read(QWEN, half).content == half
    assert read(QWEN, half, cut_off=True).content == ""


def test_text_before_a_cut_call_stays():
    """With tool_choice "auto" the model may write first; only the call goes."""
    text = f"Let me check. <tool_call>\n{CALL}\n</tool_call>"
    for end in range(len(text) + 1):
        content = read(QWEN, text[:end], cut_off=True).content
        assert "Let me check. ".startswith(content) and "<" not in content, text[:end]
        if end > len("Let me check."):
            assert content.rstrip() == "Let me check."


def test_a_bare_answer_the_tool_grammar_did_not_hold_stays_content():
    """Tools with a ``format`` and "auto": the format's grammar holds the
    output, so a JSON answer cut short is the answer, not a call; and a
    fenced block never triggers the tool grammar."""
    llama = fmt("meta-llama-Llama-3.1-8B-Instruct")
    text = '{"name": "Bob", "age'
    out = parse_output(text, llama, tools=True, tool_names=["get_weather"], cut_off=True)
    assert out.content == text
    fenced = "```python\nprint("
    json_fallback = fmt("google-gemma-2-2b-it")
    assert json_fallback.tool_calls == "json"
    out = parse_output(fenced, json_fallback, tools=True, constrained=True, cut_off=True)
    assert out.content == fenced


# -- a runner: forced calls within a client's budget ------------------------------


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model (byte-level vocabulary) under Qwen 2.5's template."""
    spec = DemoModelSpec(chat_template=read_template(QWEN), context_length=4096)
    return write_demo_model(tmp_path_factory.mktemp("forced") / "qwen.gguf", spec)


@pytest.mark.parametrize(
    "argument",
    [{"type": "string", "maxLength": 20}, {"type": "integer"}, {"enum": ["celsius", "kelvin"]}],
    ids=["bounded-string", "integer", "enum"],
)
async def test_forced_calls_close_within_200_tokens(qwen_gguf, argument):
    """At temperature 1, seed after seed: each call closes, and well within
    the budget (the wrapper's blanks no longer eat it)."""
    runner = await start_runner_with(
        LoadSpec(path=str(qwen_gguf), n_ctx=4096, n_batch=256, n_threads=1), load_timeout=60
    )
    tool = weather(argument)
    try:
        for seed in range(1, 21):
            options = {"temperature": 1.0, "seed": seed, "num_predict": 200}
            messages = await run(
                runner,
                wait=120,
                messages=ASK,
                tools=[tool],
                tool_choice="required",
                options=options,
            )
            calls = calls_of(messages)
            done = messages[-1]
            assert len(calls) == 1, (seed, done)
            assert done["done_reason"] == "stop" and done["eval_count"] < 200
            jsonschema.validate(calls[0]["arguments"], tool["function"]["parameters"])
    finally:
        await runner.close()


# -- both APIs: a cut-off call is "length", without markup ------------------------


@pytest.fixture
def qwen_model(models_dir: Path, qwen_gguf: Path) -> str:
    store = ModelStore(models_dir)
    store.create("qwen", {"qwen.gguf": store.add_blob_from_file(qwen_gguf)})
    return "qwen"


@pytest.mark.parametrize("max_tokens", [5, 30])
async def test_a_cut_off_call_on_the_openai_api(openai_client, qwen_model, max_tokens):
    # 5 tokens end inside "<tool_call>" (one byte each here), 30 inside the arguments
    request = {
        "model": qwen_model,
        "messages": ASK,
        "tools": [TOOL],
        "tool_choice": "required",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    r = await openai_client.chat.completions.create(**request)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.content
    assert not choice.message.tool_calls
    assert r.usage.completion_tokens == max_tokens

    chunks = [c async for c in await openai_client.chat.completions.create(**request, stream=True)]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not "".join(d.content or "" for d in deltas)
    assert not any(d.tool_calls for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


@pytest.mark.parametrize("max_tokens", [5, 30])
async def test_a_cut_off_call_on_the_ollama_api(ollama_client, qwen_model, max_tokens):
    options = {"temperature": 0, "num_predict": max_tokens, "tool_choice": "required"}
    r = await ollama_client.chat(qwen_model, messages=ASK, tools=[TOOL], options=options)
    assert r.done_reason == "length"
    assert r.message.content == ""
    assert not r.message.tool_calls
    assert r.eval_count == max_tokens

    parts = [
        p
        async for p in await ollama_client.chat(
            qwen_model, messages=ASK, tools=[TOOL], options=options, stream=True
        )
    ]
    assert "".join(p.message.content or "" for p in parts) == ""
    assert not any(p.message.tool_calls for p in parts)
    assert parts[-1].done and parts[-1].done_reason == "length"


async def test_a_call_that_closes_in_time_is_still_a_call(openai_client, qwen_model):
    r = await openai_client.chat.completions.create(
        model=qwen_model,
        messages=ASK,
        tools=[TOOL],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])
