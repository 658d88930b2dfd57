"""Chat templates render as llama-cpp-python's formatter does, and a hostile
template is refused with a clear error before it can hold the thread or the
memory: steps, time, and every value it builds are bounded."""

from __future__ import annotations

import sys

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from jupyter_llm.demo import CHAT_TEMPLATE
from jupyter_llm.runner import chat_template
from jupyter_llm.runner.chat_template import ChatTemplate, _asks_huge_width
from jupyter_llm.runner.protocol import InputError

CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "and now?"},
]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"x": "é"}}}]
RICH = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% generation %}{{ m.role | upper }}: {{ m.content | trim }}{% endgeneration %}\n"
    "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
    "{{ messages[1:] | length }}{{ messages[-1]['content'][:3] }}{{ 'abcdef'[::2] }}"
    "{{ '%-6s|' % 'ok' }}{{ '{:>4}'.format(7) }}{{ 'ab' * 2 ~ 'c' }}{{ eos_token }}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def render(source: str, messages=CHAT, tools=None) -> str:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(messages, tools)


@pytest.mark.parametrize("source", [CHAT_TEMPLATE, RICH])
def test_renders_like_llama_cpp(source):
    theirs = Jinja2ChatFormatter(template=source, bos_token="<s>", eos_token="</s>")
    assert render(source, tools=TOOLS) == theirs(messages=CHAT, tools=TOOLS).prompt


def test_a_long_chat_is_fine():
    chat = [{"role": "user", "content": f"message {i}"} for i in range(10_000)]
    assert render(CHAT_TEMPLATE, chat).count("<|im_start|>user") == 10_000


def test_a_template_error_is_input_error():
    with pytest.raises(InputError, match="chat template failed: no system role"):
        render("{{ raise_exception('no system role') }}")


NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
DOUBLING = (
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s OP ns.s %}{% endfor %}{{ ns.s | length }}"
)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (NESTED, "more than 100,000 steps"),  # 10^10 steps of nothing
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "chat template"),
        ("{{ range(10**9) | length }}", "chat template failed"),  # the sandbox's own cap
        ("{{ 'x' * 10**12 }}", "built more than"),
        ("{{ ['x'] * 10**12 }}", "built more than"),
        (DOUBLING.replace("OP", "~"), "built more than"),
        (DOUBLING.replace("OP", "+"), "built more than"),
        ("{{ 'x'.ljust(10**12) }}", "built more than"),
        ("{{ 'x' | center(10**12) }}", "built more than"),
        ("{{ 'x' | indent(10**12, true) }}", "built more than"),
        ("{{ '%999999999s' % 'x' }}", "format width"),
        ("{{ '%.999999999f' % 1.5 }}", "format width"),
        ("{{ '%*s' % (10**12, 'x') }}", "built more than"),
        ("{{ '{:>999999999}'.format('x') }}", "format width"),
        ("{{ '%999999999s' | format('x') }}", "format width"),
        ("{{ 7 ** 100000 }}", "number that is too large"),
        (
            "{% set ns = namespace(n=3) %}{% for i in range(40) %}"
            "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n }}",
            "number that is too large",
        ),
        (  # copies by slicing, kept in a list
            "{% set ns = namespace(l=[], s='x' * 1000000) %}{% for i in range(100) %}"
            "{% set ns.l = ns.l + [ns.s[1:]] %}{% endfor %}",
            "built more than",
        ),
        ("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}", "built more than"),
    ],
)
def test_hostile_templates_are_refused(monkeypatch, source, match):
    monkeypatch.setattr(chat_template, "MAX_STEPS", 100_000)
    monkeypatch.setattr(chat_template, "MAX_CHARS", 16 << 20)
    with pytest.raises(InputError, match=match):
        render(source)


def test_time_limit(monkeypatch):
    monkeypatch.setattr(chat_template, "TIME_LIMIT", 0.0)  # already over after 1024 steps
    with pytest.raises(InputError, match="chat template took longer than 0s"):
        render(NESTED)


def test_one_requests_renders_share_one_time_limit(monkeypatch):
    """A history cut to fit the context is rendered once per step of its
    search: 17 renders of a 16,001-message chat, each within its own 5 s,
    held the runner (and every stream on it) for 14 s. The renders of one
    request share the limit: three renders that took 2 s each stop the fourth."""
    clock = [0.0]
    monkeypatch.setattr(chat_template, "_now", lambda: clock[0])
    template = ChatTemplate(CHAT_TEMPLATE, bos_token="", eos_token="")
    with chat_template.request_deadline():
        for _ in range(3):
            template.render(CHAT)
            clock[0] += 2.0
        with pytest.raises(InputError, match="this request's chat took longer than 5s"):
            template.render(CHAT)
    template.render(CHAT)  # the next request has its own


def test_each_render_has_its_own_budget_and_the_tracer_is_put_back(monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_CHARS", 1 << 20)
    template = ChatTemplate("{{ 'x' * (400 * 1024) }}", bos_token="", eos_token="")
    before = sys.gettrace()
    for _ in range(3):  # 0.8 MiB per render (the value, then the output), 2.4 MiB in all
        assert len(template.render(CHAT)) == 400 * 1024
    assert sys.gettrace() is before
    with pytest.raises(InputError):
        ChatTemplate(NESTED.replace("100000", "3000"), "", "").render(CHAT)
    assert sys.gettrace() is before


def test_the_budget_grows_with_what_the_request_brought(monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_CHARS", 1 << 20)
    big = [{"role": "user", "content": "y" * (4 << 20)}]  # 4 MiB of input: 33 MiB to build
    assert len(render(CHAT_TEMPLATE, big)) > 4 << 20


@pytest.mark.parametrize(
    ("text", "huge"),
    [
        ("%123456789d", True),
        ("%.123456789f", True),
        ("%-+ 0999999999s", True),
        ("{:123456789}", True),
        ("{0:>999999999}", True),
        ("%5d and {:5}", False),
        ("%0000000001d", False),  # zeros are the zero-pad flag: width 1
        ("{x} {y!r}", False),
        # hostile shapes that made the old regex backtrack (quadratic or worse);
        # they must finish well inside the test's timeout
        ("{" + ":" * 40_000, False),
        ("{" + ":1" * 40_000, False),
        ("%" + "0" * 40_000, False),
        ("%" * 40_000, False),
        ("{" * 40_000 + ":" + "1" * 9 + "}", True),
    ],
)
def test_huge_format_widths_are_found_in_linear_time(text, huge):
    assert _asks_huge_width(text) is huge
