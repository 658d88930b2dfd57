"""The tool-call reader on output no real model writes but any model can be
made to (a ``format``, a prompt injection): nesting past the bound, values
JSON cannot carry, markers that never close. Each is read as content or a
call, never an exception (issue 23, attack 2: ``<tool_call>`` and 1000 ``[``
raised RecursionError inside the runner's decode step and killed it)."""

from __future__ import annotations

import json

import pytest

from jupyter_llm.chat_formats import (
    OutputStream,
    detect_format,
    parse_output,
    parse_tool_calls,
    read_template,
)
from jupyter_llm.chat_formats.bounded_json import (
    MAX_NESTING,
    TooDeep,
    json_depth,
    loads,
    raw_decode,
    sendable,
)
from jupyter_llm.chat_formats.call_readers import MAX_CALLS
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
)
from jupyter_llm.chat_formats.tool_calls import MAX_CALL_CHARS
from jupyter_llm.request.limits import SCHEMA_DEPTH

N = MAX_NESTING
TEMPLATES = {
    "hermes": "Qwen-Qwen2.5-7B-Instruct",
    "qwen3": "Qwen-Qwen3-0.6B",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407",
    "r1": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "gpt_oss": "openai-gpt-oss-120b",
    "qwq": "Qwen-QwQ-32B",
}


def fmt(name: str):
    return detect_format(read_template(TEMPLATES[name]))


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def test_the_bound_is_the_shared_one():
    assert MAX_NESTING == SCHEMA_DEPTH.value == 64


@pytest.mark.parametrize(
    ("text", "start", "depth"),
    [
        ("", 0, 0),
        ("1", 0, 0),
        ('"[[[["', 0, 0),  # a string, not nesting
        ("[]", 0, 1),
        ('{"a": [1, {"b": []}]}', 0, 4),
        ('["]]]]", [[]]]', 0, 3),  # brackets inside strings do not count
        ('["\\"]", [[]]]', 0, 3),  # nor an escaped quote's
        ('["\\\\", [[]]]', 0, 3),  # an escaped backslash ends before the quote
        ("[[]] [[[[[[]]]]]]", 0, 2),  # the first value only
        ("x [[[]]]", 2, 3),  # from ``start``
        ("[" * 1000, 0, N + 1),  # counted no further than the bound
        (nested(N), 0, N),
        (nested(N + 1), 0, N + 1),
        ('["' + "[" * 1000, 0, 1),  # an unclosed string swallows the rest
        ("[}" + "[" * 1000, 0, 1),  # broken where a decoder stops
    ],
)
def test_json_depth(text, start, depth):
    assert json_depth(text, start) == depth


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (nested(N), json.loads(nested(N))),
        ('  {"a": ' + nested(N - 1) + "}\n", {"a": json.loads(nested(N - 1))}),
        ('"' + "[" * 5000 + '"', "[" * 5000),
    ],
)
def test_loads_within_the_bound(text, value):
    assert loads(text) == value


@pytest.mark.parametrize(
    "text",
    [nested(N + 1), "[" * 1000, "[" * 100_000, '{"a":' * 1000, " \n" + "[" * 3000 + "]" * 3000],
)
def test_loads_past_the_bound_is_a_value_error(text):
    with pytest.raises(TooDeep, match=f"deeper than {N}"):
        loads(text)
    with pytest.raises(ValueError):
        raw_decode(text.strip(), 0)


@pytest.mark.parametrize(
    ("values", "ok"),
    [
        (("f", {"a": [1, "x", None]}), True),
        (("f", {"a": "\ud800"}), False),  # a lone surrogate: not UTF-8
        (("\udfff", {}), False),
        (("f", {"a": float("nan")}), False),  # not JSON
        (("f", {"a": b"x"}), False),  # a Python literal JSON has no form for
        (("f", {"a": {1, 2}}), False),
        (("f", {"a": "é😀"}), True),
    ],
)
def test_sendable(values, ok):
    assert sendable(*values) is ok


DEEP = nested(1000)
# (format, output, the calls' names, content kept): every one is read, none raises
CASES = [
    ("hermes", "<tool_call>" + "[" * 1000, [], "<tool_call>" + "[" * 1000),
    ("hermes", "<tool_call>" + "[" * 1000 + "</tool_call>", [], None),
    ("hermes", '<tool_call>{"name": "f", "arguments": ' + DEEP + "}</tool_call>", [], None),
    ("hermes", '<tool_call>{"name": "f", "arguments": "' + DEEP + '"}</tool_call>', [], None),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "\\ud800"}}</tool_call>', [], None),
    ("hermes", '<tool_call>{"name": "\\udc00", "arguments": {}}</tool_call>', [], None),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>', [], None),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', ["f"], ""),
    # Qwen3-Coder's form: a value past the bound is kept as its text
    (
        "hermes",
        "<tool_call><function=f><parameter=p>" + DEEP + "</parameter></function></tool_call>",
        ["f"],
        "",
    ),
    # parameters that never close: none (and each is not searched to the end)
    ("hermes", "<tool_call><function=f>" + "<parameter=p>" * 500 + "</function>", ["f"], ""),
    ("hermes", '<tool_call><function=f><parameter=p>"\\ud800"</parameter></function>', [], None),
    ("llama3", DEEP, [], DEEP),
    ("llama3", "<|python_tag|>" + DEEP, [], None),
    ("llama3", "<|python_tag|>f.call(a=" + "(" * 1000 + "1" + ")" * 1000 + ")", [], None),
    ("llama3", "<|python_tag|>f.call(a=" + "-" * 100_000 + "1)", [], None),
    ("llama3", "<|python_tag|>f.call(a=" + "1+" * 100_000 + "1)", [], None),
    ("llama3", '<|python_tag|>f.call(a=b"x")', [], None),
    ("llama3", "<|python_tag|>f.call(a=1)", ["f"], ""),
    ("llama3", '{"name": "f", "arguments": {}}' * (MAX_CALLS + 1), [], None),
    ("llama3", '{"name": "f", "arguments": {}};' * 3, ["f", "f", "f"], ""),
    ("mistral", "[TOOL_CALLS]" + DEEP, [], None),
    ("mistral", "[TOOL_CALLS]" + "[" * 1000, [], None),
    ("mistral", "[TOOL_CALLS]f[ARGS]" + DEEP, [], None),
    ("mistral", "[TOOL_CALLS]f[ARGS]" + "{" * 1000, [], None),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": 1}', ["f"], ""),
    (
        "r1",
        DEEPSEEK_CALLS_BEGIN
        + DEEPSEEK_CALL_BEGIN
        + "function"
        + DEEPSEEK_SEP
        + "f\n```json\n"
        + DEEP
        + "\n```"
        + DEEPSEEK_CALL_END
        + DEEPSEEK_CALLS_END,
        [],
        None,
    ),
    (
        "r1",
        DEEPSEEK_CALLS_BEGIN
        + DEEPSEEK_CALL_BEGIN
        + "function"
        + DEEPSEEK_SEP
        + "f\n```json\n"
        + " " * 5000
        + "x",
        [],
        None,
    ),
    ("r1", DEEPSEEK_CALLS_BEGIN + DEEPSEEK_CALL_BEGIN * 3000, [], None),
    (
        "r1",
        DEEPSEEK_CALLS_BEGIN
        + DEEPSEEK_CALL_BEGIN
        + "function"
        + DEEPSEEK_SEP
        + 'f\n```json\n{"a": 1}\n```'
        + DEEPSEEK_CALL_END
        + DEEPSEEK_CALLS_END,
        ["f"],
        "",
    ),
    (
        "gpt_oss",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" + DEEP + "<|call|>",
        [],
        None,
    ),
    ("gpt_oss", "<|start|>assistant" + " " * 5000 + "x", [], None),
    ("qwq", "[" * 1000 + "</think><tool_call>" + "[" * 1000, [], None),
    ("qwq", "<think>" + "unterminated thinking " * 500, [], ""),
]


@pytest.mark.parametrize(("family", "text", "names", "content"), CASES)
def test_pathological_output_is_read_whole_and_streamed(family, text, names, content):
    f = fmt(family)
    whole = parse_output(text, f, tools=True, split_thinking=f.can_think, tool_names=["f"])
    assert [c.name for c in whole.tool_calls] == names
    if content is not None:
        assert whole.content == content
    for call in whole.tool_calls:
        assert sendable(call.name, call.arguments, call.id)
    # the same output streamed in pieces reads the same
    stream = OutputStream(f, tools=True, split_thinking=f.can_think, tool_names=["f"])
    got = [stream.feed(text[i : i + 3]) for i in range(0, len(text), 3)] + [stream.finish()]
    assert [c.name for d in got for c in d.tool_calls] == names
    assert "".join(d.content for d in got) == whole.content
    assert "".join(d.thinking for d in got) == whole.thinking


def test_nesting_past_the_bound_is_content_at_once_not_at_the_end():
    """A call nested past the bound cannot become one: its text goes out as
    content as soon as the bound is passed, not held to the end."""
    stream = OutputStream(fmt("llama3"), tools=True, split_thinking=False)
    shown = ""
    for _ in range(N + 1):
        shown += stream.feed("[").content
    assert shown == "[" * (N + 1)
    assert stream.feed("[[").content == "[["


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize("blank", [" ", "\n", " \n\t"])
def test_blanks_held_back_come_out_as_before(family, blank):
    """Blanks are held back (before a marker they are dropped) without being
    stripped again for each piece; what comes out is what the whole text gives."""
    f = fmt(family)
    for text in (blank * 300 + "answer", "a" + blank * 300, "<think>" + blank * 300 + "x"):
        whole = parse_output(text, f, tools=True, split_thinking=f.can_think)
        stream = OutputStream(f, tools=True, split_thinking=f.can_think)
        got = [stream.feed(ch) for ch in text] + [stream.finish()]
        assert "".join(d.content for d in got) == whole.content
        assert "".join(d.thinking for d in got) == whole.thinking


def test_parse_tool_calls_takes_the_same_bound():
    parsed = parse_tool_calls('{"name": "f", "arguments": ' + DEEP + "}", fmt("llama3"), ["f"])
    assert parsed.tool_calls == [] and parsed.content.startswith('{"name"')


def test_a_call_that_never_closes_is_content_past_its_bound():
    """Held back whole, an unclosed call would be sent as one line at the end
    (and a line over the server's limit ends the runner): past
    ``MAX_CALL_CHARS`` it goes out as content, and later calls are still read."""
    stream = OutputStream(fmt("hermes"), tools=True, split_thinking=False)
    piece = "x" * 4096
    shown = stream.feed("<tool_call>").content
    while len(shown) < MAX_CALL_CHARS:
        shown += stream.feed(piece).content
    assert shown.startswith("<tool_call>xxx") and len(shown) <= MAX_CALL_CHARS + 2 * len(piece)
    after = stream.feed(' <tool_call>{"name": "f", "arguments": {}}</tool_call>')
    after += stream.finish()
    assert [c.name for c in after.tool_calls] == ["f"]


@pytest.mark.parametrize("template", ["hermes", "qwq"])
def test_blanks_held_back_go_out_past_their_bound(template):
    """A model writing only blanks (a call or a tag may follow them) cost every
    token a copy of all held so far: past ``MAX_HELD_BLANKS`` they are text."""
    from jupyter_llm.chat_formats.markers import MAX_HELD_BLANKS

    f = fmt(template)
    stream = OutputStream(f, tools=True, split_thinking=f.can_think, tool_names=["f"])
    out = stream.feed("    ")
    for _ in range(MAX_HELD_BLANKS):
        out += stream.feed("    ")
    assert MAX_HELD_BLANKS < len(out.content + out.thinking) <= 4 * (MAX_HELD_BLANKS + 1)
    after = stream.feed('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    after += stream.finish()
    assert [c.name for c in after.tool_calls] == ["f"]  # calls are still read after them


@pytest.mark.parametrize("tools", [True, False])
def test_a_harmony_header_never_closed_goes_out_past_its_bound(tools):
    """A header is held until its ``<|message|>``: one a prompt injection never
    closes was held to the end of the output (one character a token, with no
    end under context shift). Past ``MAX_HEADER_CHARS`` it is text, and later
    messages are still read."""
    from jupyter_llm.chat_formats.harmony import MAX_HEADER_CHARS

    stream = OutputStream(fmt("gpt_oss"), tools=tools, split_thinking=True, tool_names=["f"])
    out = stream.feed("<|start|>assistant<|channel|>final")
    held = 0
    while len(out.content) <= MAX_HEADER_CHARS and held < 65536:
        out += stream.feed("x" * 16)
        held += 16
    assert "xxxx" in out.content and held <= MAX_HEADER_CHARS + 16
    after = stream.feed("<|end|><|start|>assistant<|channel|>final<|message|>Hi")
    after += stream.finish()
    assert after.content.endswith("Hi")


def test_markers_in_a_harmony_header_past_its_bound_are_still_read():
    """A header over its bound goes out as text (its own opening included); the
    markers after it (an end, a new message) are read, not shown, also when
    one is split across pieces."""
    stream = OutputStream(fmt("gpt_oss"), tools=False, split_thinking=True)
    out = stream.feed("<|start|>assistant<|channel|>final")
    out += stream.feed("x" * 1100 + "<|en")
    out += stream.feed("d|><|start|>assistant<|channel|>final<|message|>Hi")
    out += stream.finish()
    assert "x" * 1000 in out.content and out.content.endswith("Hi")
    assert "<|end|>" not in out.content and "<|start|>" not in out.content


def counted_reads(stream: OutputStream) -> list[int]:
    """Count the runs of the stream's call reader (the held text each time)."""
    tools = stream._tools  # its tool-call reader
    assert tools is not None
    reads: list[int] = []
    grammar = tools._grammar
    read = grammar.read

    def counting(text: str, final: bool):
        reads.append(len(text))
        return read(text, final)

    tools._grammar = type(grammar)(**{**grammar.__dict__, "read": counting})
    return reads


@pytest.mark.parametrize(
    ("family", "opening", "piece"),
    [
        ("llama3", "{)", "[]"),
        ("llama3", "{)", '["x"]'),
        ("mistral", "[TOOL_CALLS]{)", "[]"),
        ("llama3", "<|python_tag|>{)", "()"),
    ],
)
def test_a_closer_that_matches_no_opener_ends_the_call(family, opening, piece):
    """Brackets were counted, not matched: after ``{)`` every ``[]`` at
    "depth 0" ran the reader over the whole held text again (100 ms a
    token at 800k characters, in the decode loop every slot shares), and
    nothing streamed. A closer matching no opener means no call: the text
    goes out as content, and the reader never runs on it again."""
    stream = OutputStream(fmt(family), tools=True, split_thinking=False)
    reads = counted_reads(stream)
    shown = stream.feed(opening).content
    for _ in range(2000):
        shown += stream.feed(piece).content
    shown += stream.finish().content
    assert shown == opening + piece * 2000
    assert len(reads) <= 2


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_a_value_that_closed_and_does_not_decode_is_content_at_once(family):
    """``{"a" [...]}``: balanced, but not JSON. The reader waited for more
    and read the whole held text again at each later value's close."""
    stream = OutputStream(fmt(family), tools=True, split_thinking=False)
    reads = counted_reads(stream)
    marker = "[TOOL_CALLS]" if family == "mistral" else ""
    broken = marker + '{"a" [' + "1," * 50_000 + "1]}"
    shown = stream.feed(broken).content
    assert shown == broken  # out at once, not at the end
    for _ in range(1000):
        shown += stream.feed("{}").content
    shown += stream.finish().content
    assert shown == broken + "{}" * 1000
    assert sum(reads) < 4 * len(broken)  # the long text was read a few times, not 1000


def test_a_fenced_block_with_an_odd_quote_streams_once_it_closes():
    """The fallback format reads a fenced block as a possible call: code in
    it with one '"' made bracket counting take the rest of the answer for a
    string, and nothing streamed until the end."""
    from jupyter_llm.chat_formats import FALLBACK

    stream = OutputStream(FALLBACK, tools=True, tool_names=["f"])
    shown = ""
    for piece in ["```", "python\n", "q = '", '"', "'\n", "```", "\n"]:
        shown += stream.feed(piece).content
    prose = ["Then more prose. "] * 100
    for piece in prose:
        shown += stream.feed(piece).content
    assert len(shown) > 17 * 90  # streamed as it came
    assert shown + stream.finish().content == "```python\nq = '\"'\n```\n" + "".join(prose)


@pytest.mark.parametrize("tools", [True, False])
def test_harmony_blanks_between_messages_go_out_past_their_bound(tools):
    """Blanks between gpt-oss messages were held without a bound, each
    piece copying all held before it (400k blank tokens: 85 s in the decode
    loop), and nothing streamed. Past ``MAX_HELD_BLANKS`` they are text."""
    from jupyter_llm.chat_formats.markers import MAX_HELD_BLANKS

    stream = OutputStream(fmt("gpt_oss"), tools=tools, split_thinking=True, tool_names=["f"])
    out = stream.feed("<|start|>assistant<|channel|>final<|message|>Hi<|end|>")
    sent = 0
    for _ in range(3 * MAX_HELD_BLANKS):
        sent += len(stream.feed(" ").content)
    assert sent >= 2 * MAX_HELD_BLANKS - 1  # streamed, not held
    out += stream.feed("<|start|>assistant<|channel|>final<|message|>Bye")
    out += stream.finish()
    assert out.content.startswith("Hi") and out.content.endswith("Bye")


@pytest.mark.parametrize("recipient", ["functions.f", "browser.search"])
def test_a_harmony_message_to_a_tool_goes_out_past_the_call_bound(recipient):
    """A message to a tool was held whole, without the bound other calls
    have: its 2M characters arrived at the end (a function's), or never (a
    built-in tool the request did not offer). Past ``MAX_CALL_CHARS`` it is
    content, streamed."""
    stream = OutputStream(fmt("gpt_oss"), tools=True, split_thinking=True, tool_names=["f"])
    stream.feed(f"<|start|>assistant<|channel|>commentary to={recipient}<|message|>")
    sent = 0
    for _ in range(MAX_CALL_CHARS // 1000 + 50):
        sent += len(stream.feed("x" * 1000).content)
    assert sent > MAX_CALL_CHARS
    end = stream.finish()
    assert end.tool_calls == []
