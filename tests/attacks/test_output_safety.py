"""Model text (and server-supplied strings) shown to a person never runs as
HTML in the notebook or as escape sequences in a terminal.

JupyterLab does not sanitize the outputs of cells the user ran, so every
Markdown string we publish is rendered here with a Markdown renderer that
passes raw HTML and every URL through, and the HTML it makes is checked.
"""

from __future__ import annotations

import argparse
import re
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_llm.connect.terminal import terminal_text
from jupyter_llm.connect.views import loaded_table, model_details, models_table
from jupyter_llm.kernel.markdown import safe_markdown
from jupyter_llm.kernel.results import Chat, Generation, Metrics

mistune = pytest.importorskip("mistune")

PAYLOADS = [
    "<b>hello</b>",
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "[x](javascript:alert(1))",
]
# tags safe_markdown itself writes, and what Markdown syntax renders to
ALLOWED_TAGS = {
    "p", "em", "strong", "code", "pre", "a", "img", "h1", "h2", "h3", "h4", "h5", "h6",
    "ul", "ol", "li", "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td",
    "del", "sub",
}  # fmt: skip
SAFE_SCHEMES = ("http:", "https:", "mailto:")


# raw HTML and every URL pass through, as in a trusted JupyterLab output
RENDER = mistune.create_markdown(
    renderer=mistune.HTMLRenderer(escape=False, allow_harmful_protocols=True),
    plugins=["table", "url", "strikethrough"],
)


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self.code: list[str] = []
        self._in_code = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        if tag == "code":
            self._in_code += 1
            self.code.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "code":
            self._in_code -= 1

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_code:
            self.code[-1] += data


def rendered(markdown: str) -> Elements:
    parser = Elements()
    parser.feed(RENDER(markdown))
    parser.close()
    return parser


def unsafe_url(url: str) -> bool:
    cleaned = re.sub(r"[\x00-\x20]", "", url).lower()
    scheme = re.match(r"^[a-z][a-z0-9+.\-]*:", cleaned)
    return bool(scheme) and not cleaned.startswith(SAFE_SCHEMES)


def assert_inert(markdown: str) -> Elements:
    """No tag or attribute beyond what Markdown syntax makes, no script URL."""
    # the only "<" are the few tags safe_markdown writes itself
    assert "<" not in re.sub(r"</?(pre|code|sub)>", "", markdown), markdown
    elements = rendered(markdown)
    for tag, attrs in elements.tags:
        assert tag in ALLOWED_TAGS, (tag, markdown)
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name, markdown)
            if name in ("href", "src"):
                assert not unsafe_url(value or ""), (tag, value, markdown)
    return elements


# -- safe_markdown -----------------------------------------------------------------------------
@pytest.mark.parametrize("payload", PAYLOADS)
def test_model_html_is_shown_as_text(payload):
    elements = assert_inert(safe_markdown(payload))
    if not payload.startswith("["):
        assert "".join(elements.text).strip() == payload  # visible, as the model wrote it


def test_markdown_syntax_still_renders():
    elements = assert_inert(safe_markdown("# Title\n\n**bold** *it* `x`\n\n- a\n- b\n\n> quoted"))
    tags = {tag for tag, _ in elements.tags}
    assert {"h1", "strong", "em", "code", "ul", "li", "blockquote"} <= tags


def test_code_blocks_show_their_text_exactly():
    code = "if a < b and c > d:\n    print('<b>&amp;</b>')\n"
    markdown = safe_markdown(f"Look:\n\n```python\n{code}```\n\nafter *that*")
    elements = assert_inert(markdown)
    assert elements.code == [code]  # no "&lt;" shown inside the block
    assert "em" in {tag for tag, _ in elements.tags}
    # a block with nothing to escape stays a fenced block (so it is highlighted)
    plain = safe_markdown("```python\nprint(1)\n```")
    assert plain.startswith("```python\n") and rendered(plain).code == ["print(1)\n"]


def test_inline_code_shows_its_text_exactly():
    elements = assert_inert(safe_markdown("use `List<int>` and `a*b*c`, not `x`"))
    assert elements.code == ["List<int>", "a*b*c", "x"]


@pytest.mark.parametrize(
    "text",
    [
        "[x](javascript:alert(1))",
        "[x]( JaVaScRiPt:alert(1))",
        "[x](\njavascript:alert(1))",
        "[x](javascript\\:alert(1))",
        "[x](&#106;avascript:alert(1))",
        "[x](javascript&colon;alert(1))",
        "[x](java&Tab;script:alert(1))",
        "![x](javascript:alert(1))",
        "[x][r]\n\n[r]: javascript:alert(1)",
        "[x]\n\n[x]:\n  vbscript:msgbox(1)",
        "[x](data:text/html,<script>alert(1)</script>)",
        "<javascript:alert(1)>",
        "`[x](javascript:alert(1))`",
        "```\n[x](javascript:alert(1))\n```",
    ],
)
def test_script_links_are_neutralised(text):
    assert_inert(safe_markdown(text))


def test_ordinary_links_keep_working():
    elements = assert_inert(safe_markdown("[docs](https://example.org/a?b=1&c=2) and www.x.org"))
    hrefs = [dict(attrs)["href"] for tag, attrs in elements.tags if tag == "a"]
    assert hrefs[0] == "https://example.org/a?b=1&c=2"


@pytest.mark.parametrize(
    "text",
    [
        # a fence inside a list item ends with the item; the next item is text again
        "- a\n  ```\n- <img src=x onerror=alert(1)>",
        "- a\n  ```\n- [x](javascript:alert(1))",
        # a table splits cells at "|", even inside backticks
        "| a | b |\n|---|---|\n| `x | <img src=x onerror=alert(1)>` |",
        "| a | b |\n|---|---|\n| `x | [x](javascript:alert(1))` |",
        "```\n<img src=x onerror=alert(1)>",  # never closed
        "```<img src=x onerror=alert(1)>\nx\n```",  # in the info string
        "~~~\n</code></pre><img src=x onerror=alert(1)>\n~~~",
        "`` ` <img src=x onerror=alert(1)> ``",
        "\\`<img src=x onerror=alert(1)>`",
        "&lt;img src=x onerror=alert(1)&gt;",
    ],
)
def test_parser_disagreements_stay_inert(text):
    assert_inert(safe_markdown(text))


PIECES = st.sampled_from(
    [*PAYLOADS, "`", "```", "~~~", "\n", "  ", "- ", "| ", "|---|", "> ", "\\", "[x]", "](", "]:",
     "javascript:", "&", "#", "*", "<", ">", "a", "<pre>", "</code>", "\t"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=30).map("".join))
def test_any_text_is_inert(text):
    assert_inert(safe_markdown(text))


# -- what the kernel displays ------------------------------------------------------------------
def metrics(model: str = "tiny") -> Metrics:
    return Metrics(model, eval_count=3, eval_duration_ns=10**9, done_reason="stop")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_generation_markdown_is_inert_and_plain_text_untouched(payload):
    bundle = Generation(payload, metrics())._repr_mimebundle_()
    assert_inert(bundle["text/markdown"])
    assert bundle["text/plain"].startswith(payload)


def test_generation_data_and_footer_are_inert():
    g = Generation("{}", metrics("<img src=x onerror=alert(1)>"), data={"a": "<script>x"})
    elements = assert_inert(g._repr_markdown_())
    assert '"<script>x"' in "".join(elements.code)


def test_chat_markdown_is_inert():
    chat = Chat("tiny", [{"role": "user", "content": p} for p in PAYLOADS])
    assert_inert(chat._repr_markdown_())


class ScriptedEndpoint:
    """A server whose model answers every chat with ``pieces``."""

    kind = "env"

    def __init__(self, pieces: list[str], replies: dict[str, Any] | None = None) -> None:
        self.pieces = pieces
        self.replies = replies or {}

    def stream(self, path: str, body: Any):
        for piece in self.pieces:
            yield {"message": {"role": "assistant", "content": piece}, "done": False}
        yield {"done": True, "done_reason": "stop", "eval_count": len(self.pieces)}

    def request(self, method: str, path: str, body: Any = None) -> Any:
        return self.replies[path]

    def http(self, timeout: float | None = None) -> httpx.Client:
        """For the load watcher's ``api/ps`` polls: nothing is loading."""
        ps = httpx.MockTransport(lambda request: httpx.Response(200, json={"models": []}))
        return httpx.Client(base_url="http://scripted/", transport=ps)


ATTACK = ["<img src=x ", "onerror=alert(1)>", " [x](javascript:", "alert(1)) **done**"]


def test_magic_live_display_and_result_are_inert(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_llm.kernel import magics

    shown: list[Any] = []

    class Handle:
        def update(self, obj: Any) -> None:
            shown.append(obj)

    def display(obj: Any, display_id: bool = False, **kwargs: Any) -> Handle:
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(magics, "display", display)
    llm = magics.LLMMagics(shell=InteractiveShell.instance(), endpoint=ScriptedEndpoint(ATTACK))
    llm.refresh_interval = 0  # every piece is shown
    result = llm.llm("tiny", "copy the line")
    assert result.text == "".join(ATTACK)
    live = [o.data for o in shown if hasattr(o, "data") and o.data]
    assert len(live) >= len(ATTACK)
    for markdown in live:
        assert_inert(markdown)
    assert_inert(result._repr_mimebundle_()["text/markdown"])


HOSTILE = "<img src=x onerror=alert(1)>"


def test_dashboard_escapes_every_server_string():
    from jupyter_llm.kernel.widgets import DeviceDashboard

    gib = 1 << 30
    replies = {
        "api/devices": {
            "devices": [
                {"id": "GPU-0", "library": f"CUDA{HOSTILE}", "name": HOSTILE,
                 "total_memory": 8 * gib, "free_memory": 4 * gib},
            ],
            "system": {"total_memory": 16 * gib, "free_memory": 8 * gib},
        },
        "api/ps": {
            "models": [
                {"name": HOSTILE, "size": gib, "size_vram": gib, "context_length": HOSTILE,
                 "expires_at": HOSTILE,
                 "allocations": [{"device": "GPU-0", "weights": gib, "kv_cache": 1, "graph": 1}]},
            ]
        },
    }  # fmt: skip
    dash = DeviceDashboard(ScriptedEndpoint([], replies), start=False)  # type: ignore[arg-type]
    dash.refresh()
    values = [r.value for r in dash.device_rows.children]
    values += [
        c.value for row in dash.model_rows.children for c in row.children if hasattr(c, "value")
    ]
    assert values and all("<img" not in v for v in values), values
    assert any("&lt;img" in v for v in values)
    dash.close()


# -- the terminal ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2Jhello", "[2Jhello"),
        ("a\x1b]0;pwned\x07b", "a]0;pwnedb"),
        ("keep\nnew\tlines", "keep\nnew\tlines"),
        ("over\rwrite\x08\x7f", "overwrite"),
        ("c1\x9b2J\x85", "c12J"),
        ("plain · ünïcode", "plain · ünïcode"),
    ],
)
def test_terminal_text(text, shown):
    assert terminal_text(text) == shown


def test_tables_and_details_strip_escapes():
    model = {
        "name": "\x1b[2Jevil",
        "digest": "\x1b[31mabcdef0123456789",
        "size": 1,
        "modified_at": "\x1b[2J",
        "size_vram": 0,
        "expires_at": "\x1b[2J",
    }
    details = {
        "details": {"family": "\x1b[2Jllama"},
        "model_info": {"general.architecture": "\x1b[2Jllama"},
        "capabilities": ["\x1b[2Jcompletion"],
        "parameters": "stop \x1b[2J",
        "system": "\x1b]0;title\x07be nice",
        "license": "\x1b[2JMIT",
    }
    for text in (models_table([model]), loaded_table([model]), model_details(details)):
        assert "\x1b" not in text and "\x07" not in text, text


def test_cli_run_strips_escapes_from_model_text(capsys):
    from jupyter_llm.cli import cmd_run

    endpoint = ScriptedEndpoint(["\x1b[2J", "hello\x1b]0;x\x07", " world\n"])
    args = argparse.Namespace(name="tiny", prompt=["hi"], num_predict=None)
    assert cmd_run(endpoint, args) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out == "[2Jhello]0;x world\n\n"


def test_cli_errors_and_pull_status_strip_escapes(capsys, monkeypatch):
    from jupyter_llm import cli
    from jupyter_llm.connect import LLMClientError

    class Failing(ScriptedEndpoint):
        def request(self, method: str, path: str, body: Any = None) -> Any:
            raise LLMClientError("model '\x1b[2Jx' not found")

        def stream(self, path: str, body: Any):
            yield {"status": "pulling \x1b[2J manifest"}
            yield {"status": "verifying \x9b2J"}

    monkeypatch.setattr(cli, "find_server", lambda: Failing([]))
    assert cli.main(["rm", "x"]) == 1
    assert cli.main(["pull", "x"]) == 0
    captured = capsys.readouterr()
    for stream in (captured.out, captured.err):
        assert "\x1b" not in stream and "\x9b" not in stream, stream
    assert "model '[2Jx' not found" in captured.err


def test_reading_a_links_scheme_copies_nothing_after_it():
    """Each link's scheme was read from a copy of all the text after it:
    output of many links took time growing with their square in the user's
    kernel (1.9M characters of ``[a](b `` took 16 s)."""
    from jupyter_llm.kernel.markdown import _scheme

    class Watched(str):
        copied = 0

        def __getitem__(self, key: Any) -> str:
            if isinstance(key, slice):
                Watched.copied += len(range(*key.indices(len(self))))
            return str.__getitem__(self, key)

    text = Watched("http://example.com " + "[a](b " * 100_000)
    assert _scheme(text, 0) == "http" and Watched.copied == 0
