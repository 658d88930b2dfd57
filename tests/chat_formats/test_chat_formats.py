"""Tool-call and thinking formats: detected from the real chat templates of
the major model families, and model outputs read back into content,
thinking and tool calls, finished and streamed. The outputs in the tables
are the shapes llama.cpp's own chat tests use for these templates, and the
formats the templates themselves show the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_llm.chat_formats import (
    FALLBACK,
    ChatFormat,
    OutputStream,
    ThinkingStream,
    ToolCallStream,
    detect_format,
    parse_output,
    parse_tool_calls,
    prompt_opens_thinking,
    read_template,
    split_thinking,
    template_names,
    template_variables,
)
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
)

DS_USER, DS_ASSISTANT = "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"
TEMPLATES = Path(__file__).parents[2] / "jupyter_llm" / "chat_formats" / "templates"


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def fmt_of(name: str) -> ChatFormat:
    return detect_format(template(name))


# -- detection -------------------------------------------------------------------

# template: (tool-call format, thinking, accepts tools, thinking variable, effort variable)
DETECTED = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", "none", True, "", ""),
    "Qwen-Qwen3-0.6B": ("hermes", "tags", True, "enable_thinking", ""),
    "Qwen-QwQ-32B": ("hermes", "tags", True, "enable_thinking", ""),
    "Qwen3-Coder": ("hermes", "none", True, "", ""),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("hermes", "none", True, "", ""),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", "none", True, "", ""),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3", "none", True, "", ""),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", "none", True, "", ""),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3", "none", True, "", ""),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", "none", True, "", ""),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral", "none", True, "", ""),
    "unsloth-mistral-Devstral-Small-2507": ("mistral", "none", True, "", ""),
    "openai-gpt-oss-120b": ("gpt_oss", "harmony", True, "", "reasoning_effort"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("deepseek_r1", "tags", False, "", ""),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": (
        "deepseek_r1",
        "tags",
        False,
        "enable_thinking",
        "",
    ),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek_r1", "tags", False, "enable_thinking", ""),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral", "tags", True, "", ""),
    "google-gemma-2-2b-it": ("json", "none", False, "", ""),
    "microsoft-Phi-3.5-mini-instruct": ("json", "none", False, "", ""),
}


def test_every_template_file_is_in_the_table():
    assert {p.stem for p in TEMPLATES.glob("*.jinja")} == set(DETECTED)
    assert (TEMPLATES / "README.md").exists()


@pytest.mark.parametrize("name", sorted(DETECTED))
def test_detects_the_format_of_each_real_template(name):
    fmt = fmt_of(name)
    found = (
        fmt.tool_calls,
        fmt.thinking,
        fmt.accepts_tools,
        fmt.thinking_variable,
        fmt.effort_variable,
    )
    assert found == DETECTED[name]


@pytest.mark.parametrize(
    ("source", "tool_calls", "accepts_tools", "thinking"),
    [
        ("", "json", False, "none"),
        (
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
            "json",
            False,
            "none",
        ),
        (
            "{% if tools %}Tools: {{ tools | tojson }}{% endif %}{{ messages[-1].content }}",
            "json",
            True,
            "none",
        ),
        ("{# tools are not supported #}{{ messages[-1].content }}", "json", False, "none"),
        ("{{ messages[-1].content }}<|im_start|>assistant\n<think>\n", "json", False, "tags"),
        (
            "{% if tools %}{{ tools|tojson }} Answer with <tool_call>...</tool_call>{% endif %}",
            "hermes",
            True,
            "none",
        ),
    ],
)
def test_detects_hand_made_templates(source, tool_calls, accepts_tools, thinking):
    fmt = detect_format(source)
    assert (fmt.tool_calls, fmt.accepts_tools, fmt.thinking) == (
        tool_calls,
        accepts_tools,
        thinking,
    )


def test_an_unknown_template_falls_back_to_json_objects_without_thinking():
    assert detect_format("{{ messages }}") == FALLBACK
    assert FALLBACK.tool_calls == "json" and not FALLBACK.can_think


def test_markers_are_reported():
    qwen3 = fmt_of("Qwen-Qwen3-0.6B")
    assert (qwen3.tool_call_start, qwen3.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert (qwen3.think_open, qwen3.think_close) == ("<think>", "</think>")
    assert fmt_of("Mistral-Small-3.2-24B-Instruct-2506").tool_call_start == "[TOOL_CALLS]"
    assert fmt_of("mistralai-Mistral-Nemo-Instruct-2407").tool_call_id_length == 9
    assert fmt_of("openai-gpt-oss-120b").think_open == "<|channel|>analysis<|message|>"


@pytest.mark.parametrize(
    ("name", "think", "expected"),
    [
        ("Qwen-Qwen3-0.6B", None, {}),
        ("deepseek-ai-DeepSeek-V3.1", True, {"enable_thinking": True}),
        ("mistralai-Ministral-3-14B-Reasoning-2512", True, {}),
        ("Qwen-Qwen3-0.6B", True, {"enable_thinking": True}),
        ("Qwen-Qwen3-0.6B", "high", {"enable_thinking": True}),
        ("Qwen-Qwen3-0.6B", False, {"enable_thinking": False}),
        ("openai-gpt-oss-120b", None, {}),
        ("openai-gpt-oss-120b", True, {}),
        ("openai-gpt-oss-120b", "low", {"reasoning_effort": "low"}),
        ("openai-gpt-oss-120b", "high", {"reasoning_effort": "high"}),
        ("openai-gpt-oss-120b", "max", {"reasoning_effort": "high"}),  # harmony's highest
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", True, {}),
        ("google-gemma-2-2b-it", None, {}),
        ("google-gemma-2-2b-it", False, {}),
    ],
)
def test_template_variables_for_think(name, think, expected):
    assert template_variables(fmt_of(name), think) == expected


@pytest.mark.parametrize(
    ("name", "think", "message"),
    [
        ("openai-gpt-oss-120b", False, "cannot turn thinking off"),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", False, "cannot turn thinking off"),
        ("mistralai-Ministral-3-14B-Reasoning-2512", False, "cannot turn thinking off"),
        ("google-gemma-2-2b-it", True, "does not support thinking"),
        ("google-gemma-2-2b-it", "low", "does not support thinking"),
        ("Qwen-Qwen3-0.6B", "extreme", "think must be"),
    ],
)
def test_template_variables_refuse_what_the_template_cannot_do(name, think, message):
    with pytest.raises(ValueError, match=message):
        template_variables(fmt_of(name), think)


@pytest.mark.parametrize(
    ("prompt", "opened"),
    [
        (f"{DS_USER}hi{DS_ASSISTANT}<think>\n", True),
        ("<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        (f"{DS_USER}hi{DS_ASSISTANT}<think>\n</think>", False),
        ("<|im_start|>assistant\n", False),
        ("earlier <think>x</think> turn<|im_start|>assistant\n", False),
    ],
)
def test_prompt_opens_thinking(prompt, opened):
    assert prompt_opens_thinking(prompt, fmt_of("Qwen-Qwen3-0.6B")) is opened


def test_prompt_opens_thinking_on_real_renders():
    from jupyter_llm.runner.chat_template import ChatTemplate

    chat = [{"role": "user", "content": "hi"}]
    for name, opened in [
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", True),
        ("Qwen-Qwen3-0.6B", False),
        ("deepseek-ai-DeepSeek-V3.1", False),  # thinks only when enable_thinking is given
    ]:
        prompt = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>").render(chat)
        assert prompt_opens_thinking(prompt, fmt_of(name)) is opened, name
    assert not prompt_opens_thinking("<think>\n", fmt_of("google-gemma-2-2b-it"))


# -- tool calls ------------------------------------------------------------------

HERMES = fmt_of("Qwen-Qwen2.5-7B-Instruct")
CODER = fmt_of("Qwen3-Coder")
LLAMA = fmt_of("meta-llama-Llama-3.1-8B-Instruct")
NEMO = fmt_of("mistralai-Mistral-Nemo-Instruct-2407")
SMALL = fmt_of("Mistral-Small-3.2-24B-Instruct-2506")
DEVSTRAL = fmt_of("unsloth-mistral-Devstral-Small-2507")
GPT_OSS = fmt_of("openai-gpt-oss-120b")
DEEPSEEK = fmt_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
QWEN3 = fmt_of("Qwen-Qwen3-0.6B")
QWQ = fmt_of("Qwen-QwQ-32B")
R1 = fmt_of("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")
GEMMA = fmt_of("google-gemma-2-2b-it")
V31 = fmt_of("deepseek-ai-DeepSeek-V3.1")
MINISTRAL = fmt_of("mistralai-Ministral-3-14B-Reasoning-2512")

HELLO = "Hello, world!\nWhat's up?"
F1 = ("special_function", {"arg1": 1})
F12 = ("special_function_with_opt", {"arg1": 1, "arg2": 2})
DS_CALL = (
    f"{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}function{DEEPSEEK_SEP}special_function\n"
    f'```json\n{{"arg1": 1}}```{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}'
)
EDIT_ARGS = {
    "oldString": "if (part < railCount - 1) {",
    "newString": "if (part < 4) {",
    "replaceAll": False,
}

# (format, model output, content, [(name, arguments)], ids or None)
TOOL_OUTPUTS = [
    # Hermes / Qwen
    (HERMES, HELLO, HELLO, [], None),
    (
        HERMES,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        "",
        [F1],
        None,
    ),
    (
        HERMES,
        HELLO + '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        HELLO,
        [F1],
        None,
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "special_function_with_opt", '
        '"arguments": {"arg1": 1, "arg2": 2}}\n</tool_call>',
        "",
        [F1, F12],
        None,
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "special_function", "arguments": "{\\"arg1\\": 1}"}\n</tool_call>',
        "",
        [F1],
        None,
    ),
    (HERMES, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}', "", [F1], None),
    (
        HERMES,
        "<tool_call>\n{not json}\n</tool_call>",
        "<tool_call>\n{not json}\n</tool_call>",
        [],
        None,
    ),
    (HERMES, '<tool_call>\n{"name": "special_', '<tool_call>\n{"name": "special_', [], None),
    (
        HERMES,
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        [],
        None,
    ),
    (HERMES, "a < b and <tool_ is not a call", "a < b and <tool_ is not a call", [], None),
    (
        CODER,
        "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        "",
        [F1],
        None,
    ),
    (
        CODER,
        "<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n</function>\n</tool_call>",
        "",
        [("edit", {"path": "src/a.py"})],
        None,
    ),
    # Llama 3.x
    (LLAMA, HELLO, HELLO, [], None),
    (LLAMA, '{"name": "special_function", "parameters": {"arg1": 1}}', "", [F1], None),
    (LLAMA, '\n{"name": "special_function", "parameters": {"arg1": 1}}\n', "", [F1], None),
    (
        LLAMA,
        '<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}',
        "",
        [F1],
        None,
    ),
    (
        LLAMA,
        '{"name": "special_function", "parameters": {"arg1": 1}}; '
        '{"name": "special_function_with_opt", "parameters": {"arg1": 1, "arg2": 2}}',
        "",
        [F1, F12],
        None,
    ),
    (
        LLAMA,
        "<|python_tag|>python.call(code=\"print('hey')\")",
        "",
        [("python", {"code": "print('hey')"})],
        None,
    ),
    (
        LLAMA,
        '<|python_tag|>brave_search.call(query="weather in Paris", count=3)',
        "",
        [("brave_search", {"query": "weather in Paris", "count": 3})],
        None,
    ),
    (
        LLAMA,
        "<|python_tag|>os.call(x=__import__('os'))",
        "<|python_tag|>os.call(x=__import__('os'))",
        [],
        None,
    ),
    (LLAMA, '{"answer": 42}', '{"answer": 42}', [], None),
    (LLAMA, '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', [], None),
    (
        LLAMA,
        '{"name": "special_function", "parameters": ',
        '{"name": "special_function", "parameters": ',
        [],
        None,
    ),
    (LLAMA, 'I think {"name": "x"} is neat', 'I think {"name": "x"} is neat', [], None),
    # Mistral
    (NEMO, HELLO, HELLO, [], None),
    (
        NEMO,
        '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
        "",
        [F1],
        ["123456789"],
    ),
    (
        NEMO,
        '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "000000001"}, '
        '{"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}, '
        '"id": "000000002"}]',
        "",
        [F1, F12],
        ["000000001", "000000002"],
    ),
    (
        SMALL,
        '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}',
        "",
        [F1],
        ["123456789"],
    ),
    (
        SMALL,
        '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
        '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
        "",
        [F1, F12],
        ["000000001", "000000002"],
    ),
    (DEVSTRAL, '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', "", [F1], None),
    (DEVSTRAL, HELLO + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', HELLO, [F1], None),
    (
        DEVSTRAL,
        '[TOOL_CALLS]special_function[ARGS]{"arg1": 1',
        '[TOOL_CALLS]special_function[ARGS]{"arg1": 1',
        [],
        None,
    ),
    (NEMO, "[TOOL_CALLS]nothing here", "[TOOL_CALLS]nothing here", [], None),
    # gpt-oss (harmony)
    (GPT_OSS, "<|channel|>final<|message|>" + HELLO, HELLO, [], None),
    (GPT_OSS, "<|channel|>commentary<|message|>" + HELLO, HELLO, [], None),
    (
        GPT_OSS,
        "<|channel|>commentary to=functions.special_function <|constrain|>json"
        '<|message|>{"arg1": 1}<|call|>',
        "",
        [F1],
        None,
    ),
    (
        GPT_OSS,
        ' to=functions.special_function<|channel|>commentary json<|message|>{"arg1": 1}',
        "",
        [F1],
        None,
    ),
    (
        GPT_OSS,
        '<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}',
        "",
        [F1],
        None,
    ),
    (
        GPT_OSS,
        "<|channel|>analysis<|message|>Thinking about edit...<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json"
        '<|message|>{"oldString": "if (part < railCount - 1) {", '
        '"newString": "if (part < 4) {", "replaceAll": false}',
        "Thinking about edit...",
        [("edit", EDIT_ARGS)],
        None,
    ),
    (
        GPT_OSS,
        "<|channel|>analysis<|message|>I will execute python<|end|>"
        "<|start|>assistant<|channel|>commentary to=python <|constrain|>code"
        '<|message|>print("hello")',
        "I will execute python",
        [],
        None,
    ),
    (
        GPT_OSS,
        "<|channel|>commentary to=functions.special_function<|message|>{oops<|call|>",
        "<|channel|>commentary to=functions.special_function<|message|>{oops",
        [],
        None,
    ),
    # DeepSeek R1
    (DEEPSEEK, DS_CALL, "", [F1], None),
    (DEEPSEEK, HELLO + DS_CALL, HELLO, [F1], None),
    (
        V31,
        f'{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}get_time{DEEPSEEK_SEP}{{"city": "XYZCITY"}}'
        f"{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}",
        "",
        [("get_time", {"city": "XYZCITY"})],
        None,
    ),
    (
        V31,
        f"CONTENT{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}get_time{DEEPSEEK_SEP}"
        f'{{"city": "Paris"}}'
        f'{DEEPSEEK_CALL_END}{DEEPSEEK_CALL_BEGIN}get_weather{DEEPSEEK_SEP}{{"city": "Paris"}}'
        f"{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}",
        "CONTENT",
        [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})],
        None,
    ),
    (
        V31,
        f"{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}get_time{DEEPSEEK_SEP}{{oops",
        f"{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}get_time{DEEPSEEK_SEP}{{oops",
        [],
        None,
    ),
    # the JSON-object fallback
    (GEMMA, HELLO, HELLO, [], None),
    (GEMMA, '{"name": "special_function", "arguments": {"arg1": 1}}', "", [F1], None),
    (GEMMA, '```json\n{"name": "special_function", "arguments": {"arg1": 1}}\n```', "", [F1], None),
    (
        GEMMA,
        '[{"name": "special_function", "arguments": {"arg1": 1}}, '
        '{"name": "special_function_with_opt", "parameters": {"arg1": 1, "arg2": 2}}]',
        "",
        [F1, F12],
        None,
    ),
    (
        GEMMA,
        '{"tool_calls": [{"type": "function", "function": '
        '{"name": "special_function", "arguments": "{\\"arg1\\": 1}"}}]}',
        "",
        [F1],
        None,
    ),
    (
        GEMMA,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        "",
        [F1],
        None,
    ),
    (
        GEMMA,
        '{"name": "special_function", "arguments": [1, 2]}',
        '{"name": "special_function", "arguments": [1, 2]}',
        [],
        None,
    ),
    (GEMMA, "```python\nprint(1)\n```", "```python\nprint(1)\n```", [], None),
]


def _calls(calls):
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize(("fmt", "output", "content", "calls", "ids"), TOOL_OUTPUTS)
def test_parses_tool_calls(fmt, output, content, calls, ids):
    parsed = parse_tool_calls(output, fmt)
    assert (parsed.content, _calls(parsed.tool_calls)) == (content, calls)
    if ids is not None:
        assert [c.id for c in parsed.tool_calls] == ids
    assert all(c.id for c in parsed.tool_calls)


def _stream_tools(fmt, pieces):
    stream = ToolCallStream(fmt)
    content, calls = "", []
    for piece in pieces:
        delta = stream.feed(piece)
        content += delta.content
        calls += delta.tool_calls
    delta = stream.finish()
    return content + delta.content, _calls(calls + delta.tool_calls)


@pytest.mark.parametrize(("fmt", "output", "content", "calls", "ids"), TOOL_OUTPUTS)
def test_streamed_tool_calls_match_the_finished_parse(fmt, output, content, calls, ids):
    assert _stream_tools(fmt, list(output)) == (content, calls)  # a character at a time
    for size in (2, 3, 7):
        pieces = [output[i : i + size] for i in range(0, len(output), size)]
        assert _stream_tools(fmt, pieces) == (content, calls), size


def test_streamed_content_comes_out_before_the_end_and_a_marker_is_held_back():
    stream = ToolCallStream(HERMES)
    assert stream.feed("Hello").content == "Hello"
    assert stream.feed(", world <tool").content == ", world"  # the space may precede a call
    delta = stream.feed(
        '_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>'
    )
    assert delta.content == "" and _calls(delta.tool_calls) == [F1]  # out as soon as it closes
    assert stream.feed(" more").content == "more"
    assert stream.finish().content == ""


def test_a_held_back_prefix_that_is_no_marker_comes_out():
    stream = ToolCallStream(SMALL)
    assert stream.feed("a [TOOL").content == "a"
    assert stream.feed("S] b").content == " [TOOLS] b"


def test_tool_call_shapes_for_the_apis():
    (call,) = parse_tool_calls('[TOOL_CALLS]f[CALL_ID]123456789[ARGS]{"a": 1}', SMALL).tool_calls
    assert call.openai(0) == {
        "index": 0,
        "id": "123456789",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1}'},
    }
    assert call.ollama(0) == {
        "id": "123456789",
        "function": {"index": 0, "name": "f", "arguments": {"a": 1}},
    }


# -- thinking --------------------------------------------------------------------

# (format, the prompt opened thinking, model output, thinking, content)
THINKING_OUTPUTS = [
    (QWEN3, False, "<think>\nI'm\nthinking\n</think>\n\n" + HELLO, "I'm\nthinking", HELLO),
    (QWEN3, False, "<think>I'm\nthinking</think>" + HELLO, "I'm\nthinking", HELLO),
    (QWEN3, False, HELLO, "", HELLO),
    (QWEN3, False, "<think>\n\n</think>\n\n" + HELLO, "", HELLO),
    (QWEN3, False, "<think>\nstill going, out of tokens", "still going, out of tokens", ""),
    (QWEN3, False, "I say <think> mid-answer", "", "I say <think> mid-answer"),
    (
        QWQ,
        True,
        "Let me think about this...\n</think>\nThe answer is 42.",
        "Let me think about this...",
        "The answer is 42.",
    ),
    (QWQ, True, "</think>Hello, world!", "", "Hello, world!"),
    (QWQ, False, "</think>Hello, world!", "", "Hello, world!"),
    (R1, True, "I'm\nthinking</think>" + HELLO, "I'm\nthinking", HELLO),
    (R1, True, "</think>" + HELLO, "", HELLO),
    (R1, True, "\nstill thinking", "still thinking", ""),
    (HERMES, True, "<think>no thinking here</think>", "", "<think>no thinking here</think>"),
    (MINISTRAL, False, "[THINK]I'm\nthinking[/THINK]" + HELLO, "I'm\nthinking", HELLO),
    (V31, True, "REASONING</think>\nCONTENT", "REASONING", "CONTENT"),
    (GPT_OSS, False, "<|channel|>final<|message|>" + HELLO, "", HELLO),
    (
        GPT_OSS,
        False,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
        + HELLO,
        "I'm\nthinking",
        HELLO,
    ),
    (GPT_OSS, False, "<|channel|>analysis<|message|>I'm\nthinking", "I'm\nthinking", ""),
    (
        GPT_OSS,
        False,
        "<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|>"
        "<|start|>assistant<|channel|>final<|message|>" + HELLO,
        "I'm\nthinking",
        HELLO,
    ),
    (
        GPT_OSS,
        False,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary "
        "to=assistant<|channel|>final<|message|>" + HELLO,
        "I'm\nthinking",
        HELLO,
    ),
    (
        GPT_OSS,
        False,
        "<|channel|>analysis<|message|>hmm<|end|>"
        '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": 1}',
        "hmm",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>',
    ),
]


@pytest.mark.parametrize(("fmt", "opened", "output", "thinking", "content"), THINKING_OUTPUTS)
def test_splits_thinking(fmt, opened, output, thinking, content):
    split = split_thinking(output, fmt, starts_in_thinking=opened)
    assert (split.thinking, split.content) == (thinking, content)


@pytest.mark.parametrize(("fmt", "opened", "output", "thinking", "content"), THINKING_OUTPUTS)
def test_streamed_thinking_matches_the_finished_split(fmt, opened, output, thinking, content):
    for size in (1, 2, 5):
        stream = ThinkingStream(fmt, starts_in_thinking=opened)
        got_thinking, got_content = "", ""
        for i in range(0, len(output), size):
            delta = stream.feed(output[i : i + size])
            got_thinking += delta.thinking
            got_content += delta.content
        delta = stream.finish()
        assert (got_thinking + delta.thinking, got_content + delta.content) == (
            thinking,
            content,
        ), size


def test_thinking_streams_as_it_comes():
    stream = ThinkingStream(QWEN3)
    assert stream.feed("<thi").thinking == ""
    assert stream.feed("nk>\nLet me").thinking == "Let me"
    assert stream.feed(" see\n").thinking == " see"  # the newline may end the thinking
    delta = stream.feed("more</think>\n\nAnswer")
    assert (delta.thinking, delta.content) == ("\nmore", "Answer")


# -- both ------------------------------------------------------------------------

# (format, tools offered, the prompt opened thinking, output, content, thinking, calls)
OUTPUTS = [
    (
        QWEN3,
        True,
        False,
        "<think>\nI'm\nthinking\n</think>\n\n"
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        "",
        "I'm\nthinking",
        [F1],
    ),
    (
        QWEN3,
        True,
        False,
        '<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?</think>' + HELLO,
        HELLO,
        'maybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?',
        [],
    ),
    (
        QWEN3,
        False,
        False,
        '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        "hm",
        [],
    ),
    (
        GPT_OSS,
        True,
        False,
        "<|channel|>analysis<|message|>Thinking about edit...<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json"
        '<|message|>{"oldString": "if (part < railCount - 1) {", '
        '"newString": "if (part < 4) {", "replaceAll": false}',
        "",
        "Thinking about edit...",
        [("edit", EDIT_ARGS)],
    ),
    (
        GPT_OSS,
        False,
        False,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
        + HELLO,
        HELLO,
        "I'm\nthinking",
        [],
    ),
    (
        GPT_OSS,
        True,
        False,
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
        "<|start|>assistant to=container.exec<|channel|>commentary"
        "<|message|>python3 -c 'print(\"hello\")'",
        "",
        "I will execute python to say hello",
        [],
    ),
    (DEEPSEEK, True, True, "I'm\nthinking</think>" + DS_CALL, "", "I'm\nthinking", [F1]),
    (
        MINISTRAL,
        True,
        False,
        '[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
        '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}',
        "",
        'Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more',
        [F1],
    ),
    (
        V31,
        True,
        True,
        f"REASONING</think>{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}get_time{DEEPSEEK_SEP}"
        f'{{"city": "Tokyo"}}{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}',
        "",
        "REASONING",
        [("get_time", {"city": "Tokyo"})],
    ),
    (GEMMA, True, False, '{"name": "special_function", "arguments": {"arg1": 1}}', "", "", [F1]),
    (
        GEMMA,
        False,
        False,
        '{"name": "special_function", "arguments": {"arg1": 1}}',
        '{"name": "special_function", "arguments": {"arg1": 1}}',
        "",
        [],
    ),
]


@pytest.mark.parametrize(
    ("fmt", "tools", "opened", "output", "content", "thinking", "calls"), OUTPUTS
)
def test_parses_a_whole_output(fmt, tools, opened, output, content, thinking, calls):
    parsed = parse_output(output, fmt, tools=tools, starts_in_thinking=opened)
    assert (parsed.content, parsed.thinking, _calls(parsed.tool_calls)) == (
        content,
        thinking,
        calls,
    )
    stream = OutputStream(fmt, tools=tools, starts_in_thinking=opened)
    got = [stream.feed(ch) for ch in output] + [stream.finish()]
    assert "".join(d.content for d in got) == content
    assert "".join(d.thinking for d in got) == thinking
    assert [c for d in got for c in _calls(d.tool_calls)] == calls


def test_thinking_can_be_left_in_the_content():
    output = "<think>hm</think>" + HELLO
    parsed = parse_output(output, QWEN3, tools=False, split_thinking=False)
    assert (parsed.content, parsed.thinking) == (output, "")


# -- never an exception ----------------------------------------------------------

FORMATS = [HERMES, CODER, LLAMA, NEMO, SMALL, GPT_OSS, DEEPSEEK, GEMMA, MINISTRAL]


@pytest.mark.parametrize(("fmt", "output", "content", "calls", "ids"), TOOL_OUTPUTS)
def test_a_cut_off_output_parses_the_same_streamed_and_never_raises(
    fmt, output, content, calls, ids
):
    """A generation stopped anywhere (num_predict, a stop string) still reads."""
    for end in range(len(output) + 1):
        cut = output[:end]
        whole = parse_tool_calls(cut, fmt)
        assert _stream_tools(fmt, list(cut)) == (whole.content, _calls(whole.tool_calls)), end


@pytest.mark.parametrize("fmt", FORMATS)
def test_any_format_reads_any_output(fmt):
    for _, output, *_ in TOOL_OUTPUTS:
        parsed = parse_output(output, fmt, tools=True)
        assert isinstance(parsed.content, str)
        for stream_of in (ThinkingStream(fmt), ToolCallStream(fmt)):
            for ch in output:
                stream_of.feed(ch)
            stream_of.finish()


def test_brackets_inside_strings_do_not_end_a_call():
    code = 'if (a) { b["}"] = ")" }\n' * 50
    output = '{"name": "run", "parameters": {"code": ' + json.dumps(code) + "}}"
    assert _stream_tools(LLAMA, list(output)) == ("", [("run", {"code": code})])


def test_the_bundled_templates_are_package_data():
    names = template_names()
    assert names == sorted(DETECTED)
    assert read_template("Qwen-Qwen3-0.6B") == template("Qwen-Qwen3-0.6B")
    with pytest.raises(KeyError):
        read_template("../pyproject")


@pytest.mark.parametrize(
    ("fmt", "output", "calls"),
    [
        (LLAMA, '{"name": "special_function", "parameters": {"arg1": 1}}', [F1]),
        (LLAMA, '{"name": "Bob", "parameters": {"arg1": 1}}', []),
        (
            GEMMA,
            '[{"name": "special_function", "arguments": {}}, {"name": "Bob", "arguments": {}}]',
            [],
        ),
        (LLAMA, '<|python_tag|>{"name": "Bob", "parameters": {"arg1": 1}}', [("Bob", {"arg1": 1})]),
        (
            HERMES,
            '<tool_call>{"name": "Bob", "arguments": {"arg1": 1}}</tool_call>',
            [("Bob", {"arg1": 1})],
        ),
    ],
)
def test_a_bare_json_answer_is_a_call_only_to_an_offered_tool(fmt, output, calls):
    parsed = parse_tool_calls(output, fmt, tool_names={"special_function"})
    assert _calls(parsed.tool_calls) == calls
    assert parsed.content == ("" if calls else output)
    via_output = parse_output(output, fmt, tools=True, tool_names={"special_function"})
    assert _calls(via_output.tool_calls) == calls


def test_whitespace_between_harmony_messages_is_not_content():
    output = (
        "<|channel|>analysis<|message|>hm<|end|>\n<|start|>assistant<|channel|>final<|message|>Hi"
    )
    assert parse_output(output, GPT_OSS, tools=False) == parse_output(
        output.replace("\n", ""), GPT_OSS, tools=False
    )
    assert parse_output(output, GPT_OSS, tools=False).content == "Hi"
