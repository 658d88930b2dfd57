"""Tool calls and thinking through a real runner, on generated models that
carry the real chat templates of the major families (issue 13): calls held
to the tool's schema by a grammar, history with calls and results, thinking
split from the answer, and the requests a model cannot honour refused.
Engine tests run in process and act on what was generated, never on time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from jupyter_llm.chat_formats import detect_format, read_template
from jupyter_llm.chat_formats.tool_grammar import (
    call_syntax,
    resolve_tool_choice,
    tool_grammar,
)
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.grammar.gbnf import literal
from jupyter_llm.request.options import DEFAULT_SAMPLING
from jupyter_llm.runner.completion import TokenStream
from jupyter_llm.runner.constrained import Triggers
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import Complete, Done, LoadParams
from jupyter_llm.runner.sequence import Job, make_sampler
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.process import InvalidRequest
from jupyter_llm.runner_client.proxy import start_runner_with

GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 300}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Now", "parameters": TIME},
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "Weather in Paris?"}]

FAMILIES = {
    "hermes": "Qwen-Qwen2.5-7B-Instruct",
    "qwen3": "Qwen-Qwen3-0.6B",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407",
    "mistral_args": "Mistral-Small-3.2-24B-Instruct-2506",
    "gpt_oss": "openai-gpt-oss-120b",
}


def model(tmp_path_factory: pytest.TempPathFactory, template: str) -> Path:
    spec = DemoModelSpec(chat_template=read_template(template), context_length=4096)
    return write_demo_model(tmp_path_factory.mktemp("tools") / f"{template}.gguf", spec)


async def start(path: Path) -> Any:
    return await start_runner_with(
        LoadSpec(path=str(path), n_ctx=4096, n_batch=256, n_threads=1), load_timeout=60
    )


async def run(runner: Any, wait: float = 60, **request: Any) -> list[dict[str, Any]]:
    """Every message of one completion, in order, up to ``done`` (within
    ``wait`` seconds: a hang fails, not a slow machine)."""

    async def collect() -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        async for batch in runner.complete(Complete(**request)):
            seen += batch
            if seen[-1]["type"] == "done":
                return seen
        raise AssertionError("no done message")

    return await asyncio.wait_for(collect(), wait)


def calls_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for m in messages if m["type"] == "tool_calls" for c in m["tool_calls"]]


def text_of(messages: list[dict[str, Any]], key: str = "text") -> str:
    return "".join(m.get(key) or "" for m in messages if m["type"] == "token")


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_a_required_call_is_valid_for_every_family(tmp_path_factory, family):
    runner = await start(model(tmp_path_factory, FAMILIES[family]))
    try:
        messages = await run(
            runner, messages=ASK, tools=TOOLS, tool_choice="required", options=GREEDY
        )
        calls = calls_of(messages)
        assert len(calls) == 1, text_of(messages)
        call = calls[0]
        assert call["id"].startswith("call_")
        jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
        kinds = [m["type"] for m in messages]
        assert kinds.index("tool_calls") < kinds.index("done") == len(kinds) - 1
        assert messages[-1]["tool_calls_count"] == 1
        assert messages[-1]["done_reason"] == "stop"  # the grammar ended it
        assert not text_of(messages).strip()  # the call is not content

        named = await run(
            runner, messages=ASK, tools=TOOLS, tool_choice={"name": "get_time"}, options=GREEDY
        )
        (call,) = calls_of(named)
        assert call["name"] == "get_time"
        jsonschema.validate(call["arguments"], TIME)
    finally:
        await runner.close()


@pytest.mark.parametrize("family", ["llama3", "qwen3", "mistral", "gpt_oss"])
async def test_tool_history_renders_and_runs(tmp_path_factory, family):
    history = [
        *ASK,
        {  # OpenAI's shape: arguments as JSON text, an id
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
        {"role": "assistant", "content": "It is 18 degrees."},
        {"role": "user", "content": "And the time?"},
        {  # Ollama's shape: arguments as an object, no id
            "role": "assistant",
            "content": "",
            "thinking": "the time, then",
            "tool_calls": [{"function": {"name": "get_time", "arguments": {}}}],
        },
        {"role": "tool", "tool_name": "get_time", "content": "noon"},
    ]
    runner = await start(model(tmp_path_factory, FAMILIES[family]))
    try:
        messages = await run(
            runner, messages=history, tools=TOOLS, tool_choice="required", options=GREEDY
        )
        assert len(calls_of(messages)) == 1
        assert messages[-1]["prompt_eval_count"] > 0
    finally:
        await runner.close()


async def test_thinking_is_split_from_the_answer(tmp_path_factory):
    runner = await start(model(tmp_path_factory, FAMILIES["qwen3"]))
    try:
        # a grammar makes the random model write a thought and an answer
        forced = 'root ::= "<think>" "pondering" "</think>" "\\n\\n" "the answer"'
        messages = await run(runner, messages=ASK, think=True, grammar=forced, options=GREEDY)
        assert text_of(messages, "thinking") == "pondering"
        assert text_of(messages) == "the answer"
        assert messages[-1]["tool_calls_count"] == 0

        # Qwen3 turns thinking off in its template: the prompt closes it
        messages = await run(
            runner, messages=ASK, think=False, options={**GREEDY, "num_predict": 4}
        )
        assert messages[-1]["type"] == "done"

        with pytest.raises(InvalidRequest, match="not among the tools"):
            await run(runner, messages=ASK, tools=TOOLS, tool_choice={"name": "nope"})
        with pytest.raises(InvalidRequest, match="tool_choice"):
            await run(runner, messages=ASK, tools=TOOLS, tool_choice="sometimes")
    finally:
        await runner.close()


async def test_thinking_the_prompt_opened_never_reaches_the_answer(tmp_path_factory):
    # QwQ's prompt ends in "<think>" when asked to think: the random model
    # never closes it, so all it writes is thinking, even under "required"
    runner = await start(model(tmp_path_factory, "Qwen-QwQ-32B"))
    try:
        short = {**GREEDY, "num_predict": 30}
        for choice in ("auto", "required"):
            messages = await run(
                runner, messages=ASK, tools=TOOLS, tool_choice=choice, think=True, options=short
            )
            assert len(text_of(messages, "thinking")) > 10
            assert text_of(messages) == ""
            assert messages[-1]["done_reason"] == "length"
        with pytest.raises(InvalidRequest, match="think must be"):
            await run(runner, messages=ASK, think="extreme")
    finally:
        await runner.close()


async def test_requests_a_model_cannot_honour_are_refused(tmp_path_factory):
    runner = await start(model(tmp_path_factory, FAMILIES["gpt_oss"]))
    try:
        with pytest.raises(InvalidRequest, match="cannot turn thinking off"):
            await run(runner, messages=ASK, think=False)
    finally:
        await runner.close()
    runner = await start(model(tmp_path_factory, "google-gemma-2-2b-it"))
    try:
        with pytest.raises(InvalidRequest, match='"gemma" does not support tools'):
            await run(runner, model="gemma", messages=ASK, tools=TOOLS)
        with pytest.raises(InvalidRequest, match="does not support thinking"):
            await run(runner, messages=ASK, think="high")
    finally:
        await runner.close()


# -- in process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    path = write_demo_model(tmp_path_factory.mktemp("lazy") / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_batch=64, n_threads=1))
    yield engine
    engine.close()


def generate(engine: Engine, **job: Any) -> tuple[str, Done]:
    text: list[str] = []
    done: list[Done] = []
    errors: list[Exception] = []
    engine.submit(
        Job(
            rid=1,
            tokens=engine.model.prompt_tokens("Tell me"),
            options={**GREEDY, "num_predict": 40},
            emit=text.append,
            finish=done.append,
            fail=errors.append,
            **job,
        )
    )
    while not done and not errors:
        engine.step()
    assert not errors
    return "".join(text), done[0]


def test_a_lazy_grammar_holds_from_its_trigger_on(engine):
    free, _ = generate(engine)
    # text the model writes freely, after some other text; not ending where
    # a merged token ("he", " t") could run past it
    start = next(i for i in range(4, len(free) - 3) if free[i + 2] not in "h ")
    trigger = free[start : start + 3]
    before = free[: free.index(trigger)]
    lazy = f'root ::= {literal(trigger)} "!forced!"'
    pattern = "".join(c if c.isalnum() else "\\" + c for c in trigger)
    text, done = generate(engine, grammar=lazy, triggers=Triggers(patterns=(pattern,)))
    assert text == before + trigger + "!forced!"
    assert done.done_reason == "stop"  # after the grammar, only the end


GRAMMAR_TEMPLATES = [
    *FAMILIES.values(),
    "Qwen-QwQ-32B",
    "google-gemma-2-2b-it",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
]


@pytest.mark.parametrize("template", GRAMMAR_TEMPLATES)
def test_every_tool_grammar_and_trigger_loads_in_llama_cpp(engine, template):
    # llama.cpp parses the grammar and the runner compiles the trigger
    # patterns here; a bad one would be refused
    source = read_template(template)
    fmt = detect_format(source)
    for choice, opened, parallel in [
        ("auto", False, False),
        ("auto", False, True),
        ("required", False, True),
        ("required", True, False),
        ("get_time", False, False),
    ]:
        built = tool_grammar(
            fmt,
            TOOLS,
            choice,
            syntax=call_syntax(fmt, source),
            starts_in_thinking=opened,
            parallel=parallel,
        )
        assert built is not None
        triggers = Triggers(patterns=built.trigger_patterns) if built.lazy else None
        sampler = make_sampler(
            engine.model.tokens,
            engine.candidates,
            engine.n_ctx,
            dict(DEFAULT_SAMPLING),
            built.grammar,
            triggers,
        )
        sampler.free()


def test_control_tokens_are_rendered_only_when_preserved(engine):
    marker = "<|fim_prefix|>"
    (token,) = engine.model.control_tokens([marker, "plain text"])
    grammar = f'root ::= <[{token}]> "ok"'
    assert generate(engine, grammar=grammar)[0] == "ok"
    assert generate(engine, grammar=grammar, preserve=frozenset({token}))[0] == marker + "ok"


# -- pure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, "auto"),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"name": "get_time"}, "get_time"),
        ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
    ],
)
def test_tool_choice_is_resolved(choice, expected):
    assert resolve_tool_choice(choice, TOOLS) == expected


@pytest.mark.parametrize(
    ("choice", "tools", "error"),
    [
        ({"name": "nope"}, TOOLS, "not among the tools"),
        ("always", TOOLS, "tool_choice must be"),
        ("required", None, "needs tools"),
        (42, TOOLS, "tool_choice must be"),
    ],
)
def test_bad_tool_choice_is_refused(choice, tools, error):
    with pytest.raises(ValueError, match=error):
        resolve_tool_choice(choice, tools)


@pytest.mark.parametrize(
    ("template", "syntax", "trigger"),
    [
        ("Qwen-Qwen2.5-7B-Instruct", "hermes", "<tool_call>"),
        ("meta-llama-Llama-3.1-8B-Instruct", "llama3", r"^\s*(\{[\s\S]*)$"),
        ("mistralai-Mistral-Nemo-Instruct-2407", "mistral", r"\[TOOL_CALLS\]"),
        ("Mistral-Small-3.2-24B-Instruct-2506", "mistral_args", r"\[TOOL_CALLS\]"),
        ("openai-gpt-oss-120b", "gpt_oss", r"(<\|message\|>)"),
    ],
)
def test_auto_grammars_are_lazy_on_the_format_marker(template, syntax, trigger):
    source = read_template(template)
    fmt = detect_format(source)
    assert call_syntax(fmt, source) == syntax
    built = tool_grammar(fmt, TOOLS, "auto", syntax=syntax)
    assert built is not None and built.lazy
    assert any(p.endswith(trigger) for p in built.trigger_patterns)
    forced = tool_grammar(fmt, TOOLS, "required", syntax=syntax)
    assert forced is not None and not forced.lazy and not forced.trigger_patterns
    assert tool_grammar(fmt, TOOLS, "none", syntax=syntax) is None


def test_token_stream_groups_thinking_apart():
    sent: list[tuple[str, ...]] = []
    now = [0.0]
    out = TokenStream(lambda *parts: sent.append(parts), interval=1.0, clock=lambda: now[0])
    out.add("", "hm")  # the first piece at once
    out.add("", " so")
    out.add("yes")
    out.flush()
    out.add("!")
    out.flush()
    assert sent == [("", "hm"), ("yes", " so"), ("!",)]


def test_template_variables_reach_the_template_but_never_replace_its_own():
    from jupyter_llm.runner.chat_template import ChatTemplate

    template = ChatTemplate("{{ enable_thinking }}|{{ messages | length }}", "<s>", "</s>")
    chat = [{"role": "user", "content": "hi"}]
    assert template.render(chat, None, {"enable_thinking": False, "messages": []}) == "False|1"
    assert template.render(chat) == "|1"


def test_logprobs_behind_held_back_text_go_out_in_bounded_messages():
    """Blanks a tool-call reader holds back (a call may follow them) held their
    tokens' logprobs too: 56k tokens of them made one reply line over the
    server's 64 MiB limit, and the server killed the runner with every
    stream on it. They go out on their own, ``LOGPROBS_HELD`` at a time."""
    from jupyter_llm.chat_formats import OutputStream, detect_format, read_template
    from jupyter_llm.runner.completion import LOGPROBS_HELD, CompletionReplies

    sent: list[dict] = []
    reader = OutputStream(
        detect_format(read_template("Qwen-Qwen2.5-7B-Instruct")), tools=True, split_thinking=False
    )
    replies = CompletionReplies(1, sent.append, 0.0, reader, lambda: None)
    for _ in range(3 * LOGPROBS_HELD + 10):
        replies.add_logprob({"token": " ", "logprob": -0.5, "top_logprobs": []})
        replies.emit(" ")
    assert [len(m.get("logprobs", ())) for m in sent] == [LOGPROBS_HELD] * 3
    assert all(not m.get("text") for m in sent)  # the blanks are still held
    replies.emit("done")
    replies.finish(Done(done_reason="stop"))
    entries = sum(len(m.get("logprobs", ())) for m in sent if m["type"] == "token")
    assert entries == 3 * LOGPROBS_HELD + 10
    assert "".join(m.get("text", "") for m in sent if m["type"] == "token").endswith("done")
