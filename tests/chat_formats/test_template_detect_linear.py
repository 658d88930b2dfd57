"""Reading a chat template is linear in its length, whatever its shape, and
done once per template digest (issue 23, attack 1: 40 KB of ``{#`` froze the
server for seconds through a quadratic comment-stripping regex)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from functools import partial

import pytest

from jupyter_llm.api.base import JSON_PIECE, json_pieces, next_chunk
from jupyter_llm.api.ollama_shapes import model_capabilities
from jupyter_llm.chat_formats import detect
from jupyter_llm.chat_formats.detect import (
    CACHE_SIZE,
    LONG_TEMPLATE,
    WINDOW,
    clear_template_cache,
    detect_format,
    strip_comments,
    template_format,
)
from jupyter_llm.request import helper_process

MAX_TEMPLATE = 4 << 20  # the store's largest text layer (models.store.MAX_TEXT_LAYER)


@pytest.mark.parametrize(
    ("template", "stripped"),
    [
        ("", ""),
        ("plain", "plain"),
        ("a{# c #}b", "ab"),
        ("a{#- c -#}b", "ab"),  # whitespace control keeps the delimiters' ends
        ("{# one #}x{# two #}", "x"),
        ("a{# {# nested opens #}b", "ab"),  # Jinja does not nest comments
        ("a{# c #}#}b", "a#}b"),  # a close without an open is text
        ("a#}b", "a#}b"),
        ("a{#}b#}c", "ac"),  # the open's # does not also close it
        ("a{##}b", "ab"),
        ("a{#", "a"),  # unclosed: the rest is comment (Jinja refuses the template)
        ("a{# c #}b{# never closed", "ab"),
        ("a{#}", "a"),
        ("{" * 5 + "#" * 5, "{" * 4),  # the last { opens, ### closes
        ("a{b#}c", "a{b#}c"),
        ("{{ x }}{% if y %}z{% endif %}", "{{ x }}{% if y %}z{% endif %}"),
    ],
)
def test_strip_comments(template, stripped):
    assert strip_comments(template) == stripped


class Counted(str):
    """A template that counts the characters its ``find`` calls pass over."""

    scanned = 0

    def find(self, sub, start=0, end=None):  # type: ignore[override]
        end = len(self) if end is None else min(end, len(self))
        found = str.find(self, sub, start, end)
        self.scanned += (found + len(sub) if found >= 0 else end) - start
        return found


HOSTILE = {
    "unclosed opens": "{#" * (MAX_TEMPLATE // 2),
    "empty comments": "{##}" * (MAX_TEMPLATE // 4),
    "open-close overlaps": "{#}" * (MAX_TEMPLATE // 3),
    "closes only": "#}" * (MAX_TEMPLATE // 2),
    "braces": "{" * MAX_TEMPLATE,
    "mixed": "a{#b#}{c#" * (MAX_TEMPLATE // 9),
}


@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_strip_looks_at_each_character_once(template):
    """Counted work, not time: the searches cover disjoint stretches."""
    counted = Counted(template)
    assert strip_comments(counted) == strip_comments(template)
    # windows overlap by a character: at most one more per window
    assert counted.scanned <= len(template) + len(template) // WINDOW + 1


def best_time(fn, *args, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
@pytest.mark.parametrize(
    "unit",
    ["{#", "{##}", "a{#b#}{c#", "{%", "tools ", "<think>", "[TOOL_CALLS]", "x{#}"],
)
def test_reading_a_template_grows_linearly(unit):
    """4x the template takes about 4x the time (a quadratic reader: 16x)."""
    large = unit * (MAX_TEMPLATE // len(unit))
    small = large[: len(large) // 4]
    ratio = best_time(detect_format, large) / best_time(detect_format, small)
    assert ratio < 10, f"{unit!r}: 4x the template took {ratio:.1f}x the time"


def test_a_template_at_the_store_limit_is_read_at_all():
    fmt = detect_format("{#" * (MAX_TEMPLATE // 2))
    assert fmt == detect.FALLBACK


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{# <tool_call> and <think> #}{{ messages }}", ["completion"]),  # comments don't count
        ("{# a comment mentions tools #}", ["completion"]),
        ("{% for t in tools %}{{ t }}{% endfor %}", ["completion", "tools"]),
        ("{{ if .Tools }}{{ .Tools }}{{ end }}{{ .Prompt }}", ["completion", "tools"]),  # Go
        ("<tool_call>", ["completion", "tools"]),  # shows how a call is written
        ("[TOOL_CALLS]", ["completion", "tools"]),
        ("<think>{{ x }}</think>", ["completion", "thinking"]),
        ("mytools_list", ["completion"]),  # not the tools variable
        ("{#" * 1000 + "<tool_call>", ["completion"]),  # all inside one unclosed comment
    ],
)
def test_capabilities_come_from_detect(template, expected):
    assert model_capabilities({}, template_format(template)) == expected


@pytest.fixture
def counted_detects(monkeypatch):
    """How many times ``template_format`` really read a template."""
    clear_template_cache()
    calls: list[str] = []
    real = detect.detect_format

    def counting(template: str):
        calls.append(template)
        return real(template)

    monkeypatch.setattr(detect, "detect_format", counting)
    yield calls
    clear_template_cache()


def test_a_template_is_read_once_per_digest(counted_detects):
    qwen_like = "{% if tools %}<tool_call>{% endif %}<think>"
    first = template_format(qwen_like)
    again = template_format("".join(list(qwen_like)))  # equal text, another object
    assert first is again and first == detect_format(qwen_like)
    assert counted_detects == [qwen_like]
    model_capabilities({}, template_format(qwen_like))
    assert len(counted_detects) == 1
    template_format(qwen_like + " ")
    assert len(counted_detects) == 2


def test_the_cache_is_bounded_least_recently_used_first(counted_detects):
    templates = [f"template {i}" for i in range(CACHE_SIZE + 1)]
    for t in templates[:CACHE_SIZE]:
        template_format(t)
    template_format(templates[0])  # now the most recently used
    template_format(templates[CACHE_SIZE])  # evicts templates[1]
    assert len(detect._cache) == CACHE_SIZE
    reads = len(counted_detects)
    template_format(templates[0])
    assert len(counted_detects) == reads
    template_format(templates[1])
    assert len(counted_detects) == reads + 1


def test_a_long_template_is_read_by_read_long_once(counted_detects):
    """The server reads a template past ``LONG_TEMPLATE`` in its helper
    process (``read_long``); a shorter one here; either way once per digest."""
    sent: list[int] = []

    def elsewhere(template: str) -> detect.ChatFormat:
        sent.append(len(template))
        return detect_format(template)

    short = "<think>" + "x" * (LONG_TEMPLATE - 7)
    long = "<tool_call>" + "{# #}" * (LONG_TEMPLATE // 5)
    assert template_format(short, elsewhere).thinking == "tags"
    assert sent == [] and len(counted_detects) == 1
    assert template_format(long, elsewhere).offers_tools
    assert template_format(long, elsewhere).offers_tools  # cached
    assert sent == [len(long)] and len(counted_detects) == 1


def test_a_long_template_read_in_the_helper_process_is_read_as_here():
    clear_template_cache()
    template = "{% if tools %}<tool_call>{% endif %}" + "{##}" * LONG_TEMPLATE + "<think>"
    read_long = partial(helper_process.run, detect_format)
    try:
        assert template_format(template, read_long) == detect_format(template)
    finally:
        clear_template_cache()


def test_a_lone_surrogate_has_a_digest(counted_detects):
    assert template_format("\ud800<think>").thinking == "tags"


WORDS = [
    "tools",
    ".Tools",
    "Tools",
    "xtools",
    "tools_",
    "_tools",
    "tools.",
    " ",
    "é",
    "t",
    ".",
    "s",
]


def test_the_tools_scan_agrees_with_the_regex_it_replaced():
    reference = re.compile(r"\btools\b|\.Tools\b")
    rng = random.Random(23)
    for _ in range(3000):
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))
        assert detect._mentions_tools(text) == bool(reference.search(text)), text


BIG = JSON_PIECE * 3 + 7


@pytest.mark.parametrize(
    "value",
    [
        {},
        [],
        {"a": 1, "b": [1, 2.5, None, True], "c": {"d": "e"}},
        {"template": "{#" * BIG},
        {"template": ('é"\\\n\t\x00\ud800😀' * BIG)[:BIG]},  # escapes, a lone surrogate
        {"model_info": {"tokenizer.ggml.tokens": [f"<t{i}>" for i in range(BIG // 8)]}},
        {"list": [{"x": i} for i in range(5000)], "empty": {}, "n": 0},
        ["a" * BIG, ("b" * 3, 4)],
        {1: "non-string key"},
    ],
    ids=["{}", "[]", "small", "4x piece", "escapes", "vocabulary", "objects", "list", "int key"],
)
def test_fair_json_is_what_json_dumps_writes(value):
    pieces = json_pieces(value)
    chunks = list(iter(lambda: next_chunk(pieces, JSON_PIECE), b""))
    assert b"".join(chunks) == json.dumps(value).encode()
    assert all(len(chunk) <= 6 * JSON_PIECE + 64 for chunk in chunks)  # \uXXXX is 6


NOISE = "".join(random.Random(23).choice("{#}toolsx<|") for _ in range(3 * WINDOW))


@pytest.mark.parametrize("needle", ["#}", "{#", "tools", "x", "<|channel|>"])
@pytest.mark.parametrize("start", [0, 1, WINDOW - 3, WINDOW, 2 * WINDOW + 5, 10**9])
def test_the_windowed_find_is_str_find(needle, start):
    blank = NOISE.replace(needle, "_" * len(needle))
    for at in [None, 0, WINDOW - 1, WINDOW - len(needle) + 1, WINDOW, 3 * WINDOW - 2]:
        text = blank if at is None else blank[:at] + needle + blank[at + len(needle) :]
        assert detect._find(text, needle, start) == text.find(needle, start), (at, start)


def test_the_digest_is_the_utf8_sha256():
    text = ("é😀\ud800x" * WINDOW)[: 2 * WINDOW + 3]
    expected = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    assert detect.template_digest(text) == expected
