"""Model text as Markdown that renders no HTML and no script link.

JupyterLab does not sanitize the outputs of cells the user ran, and a model's
text can be steered by whatever it read (a page given with ``-i``, a chat
template), so it must not reach the renderer as HTML. Markdown syntax keeps
working; HTML shows as the text it is:

- outside code, ``&`` and ``<`` become entities (``>`` stays: block quotes);
- a code span or fenced block with no ``<`` or ``&`` stays as written (a
  fenced block keeps its highlighting); one with them becomes a ``<code>``
  or ``<pre><code>`` element written here around escaped text, so it shows
  the text exactly;
- a link, image or reference definition whose URL has a scheme other than
  http, https or mailto gets ``#`` in front, becoming an anchor on the page;
- an image renders only from a ``data:image/...;base64`` URL (nothing is
  fetched). Any other ``![`` gets a backslash before its ``!``: the image
  becomes a link, which loads nothing until clicked, and in prose the target
  is shown beside it. An image request would carry whatever a prompt
  injection put in its URL (notebook data) to another host, unasked.

Markdown parsers disagree about where code starts and ends (list items,
table cells), so safety must not depend on agreeing with one: the only ``<``
in the result belong to the tags written here, and text kept as written
holds no ``<``, no ``&`` and no script link, so it is harmless read as code
or as text.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right

SAFE_SCHEMES = frozenset({"http", "https", "mailto"})

# where a URL follows: an inline link or image, or a reference definition
# (at the start of a line, possibly inside block quotes and list items)
_INLINE_URL = re.compile(r"\]\(\s*<?")
_DEFINITION_URL = re.compile(
    r"^(?:[ \t>]|[-*+][ \t]|\d{1,9}[.)][ \t])*\[(?:\\.|[^\\\[\]])*\]:\s*<?", re.M
)
_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})(.*)$")
_SAFE_INFO = re.compile(r"^[\w+#.-]*$")
_TICKS = re.compile(r"`+")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_IMAGE = re.compile(r"!\[")
# the one image form kept: plain alt text, a base64 raster image, nothing else
# anywhere a parser could read another URL into it
_DATA_IMAGE = re.compile(
    r"!\[[^\[\]\\`<&\n]*\]\(data:image/(?:png|jpe?g|gif|webp|bmp);base64,[A-Za-z0-9+/=]*\)",
    re.I,
)
# an image made a link above, in prose: its target is shown before it
_LINKED_IMAGE = re.compile(r"\\!\[[^\[\]\n]*\]\(\s*<?([^\s<>()]+)")
_PUNCTUATION = re.compile(r"[!-%'-/:;=?@\[-`{-~]")  # ASCII punctuation but & and <


def safe_markdown(text: str) -> str:
    """``text`` (a model's answer) as Markdown that shows any HTML as text."""
    lines = _neutralise_links(text).split("\n")
    out: list[str] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i].rstrip("\r"))
        if opening is None or (opening[2][0] == "`" and "`" in opening[3]):
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, info = opening.groups()
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        if prose:
            out.append(_prose("\n".join(prose)))
            prose = []
        out.append(_fenced(indent, fence, info, lines[i + 1 : end]))
        i = end + 1
    if prose:
        out.append(_prose("\n".join(prose)))
    return "\n".join(out)


def _neutralise_links(text: str) -> str:
    """``#`` before every link URL with a scheme other than http(s)/mailto,
    except a kept ``data:`` image's; ``\\`` before the ``!`` of every other image."""
    inserts: dict[int, str] = {}
    kept: set[int] = set()  # where the URL of a kept data: image starts
    for m in _IMAGE.finditer(text):
        if _escaped(text, m.start()):
            continue  # a literal "!" already
        if _DATA_IMAGE.match(text, m.start()):
            kept.add(text.index("](", m.start()) + 2)
        else:
            inserts[m.start()] = "\\"
    starts = {m.end() for m in _INLINE_URL.finditer(text)}
    starts |= {m.end() for m in _DEFINITION_URL.finditer(text)}
    for start in starts - kept:
        scheme = _scheme(text, start)
        if scheme is not None and scheme not in SAFE_SCHEMES:
            inserts[start] = "#"
    pieces, pos = [], 0
    for at in sorted(inserts):
        pieces += [text[pos:at], inserts[at]]
        pos = at
    return "".join([*pieces, text[pos:]])


def _show_targets(text: str) -> str:
    """Prose with each image made a link preceded by its target, as text
    (every punctuation character escaped: no link, no markup of its own)."""

    def shown(m: re.Match[str]) -> str:
        target = _PUNCTUATION.sub(lambda c: "\\" + c[0], m[1])
        return f"(image not loaded: {target}) {m[0]}"

    return _LINKED_IMAGE.sub(shown, text)


def _scheme(text: str, start: int) -> str | None:
    """The scheme of the URL at ``start`` as a browser reads it (backslashes
    and control characters ignored), or None if it has none. An ``&`` before
    the scheme ends could be an entity the renderer decodes (``&#106;``,
    ``&colon;``): that URL reads as the scheme ``&``, never a safe one."""
    letters = []
    for i in range(start, len(text)):  # no copy of the rest: a link each (quadratic)
        ch = text[i]
        if ch == ":":
            return "".join(letters).lower()
        if ch == "&":
            return "&"
        if ch == "\\" or ord(ch) < 0x20 or ch == "\x7f":
            continue
        if not (ch.isascii() and (ch.isalnum() or ch in "+-.")):
            return None
        letters.append(ch)
    return None


def _closes(line: str, fence: str) -> bool:
    rest = line.strip()
    return rest.startswith(fence) and not rest.lstrip(fence[0]).strip()


def _fenced(indent: str, fence: str, info: str, body: list[str]) -> str:
    """A fenced block: as written if it has nothing to escape, else ``<pre>``."""
    content = "\n".join(body)
    if "<" not in content and "&" not in content:
        opening = fence + (info if _SAFE_INFO.match(info.strip()) else "")
        return "\n".join([indent + opening, *body, indent + fence])
    dedented = [line[len(indent) :] if line.startswith(indent) else line for line in body]
    code = _escape("\n".join(dedented))
    lines = f"<pre><code>{code}\n</code></pre>" if body else "<pre><code></code></pre>"
    return "\n".join(indent + line for line in lines.split("\n"))


def _prose(text: str) -> str:
    """Text outside fenced blocks: code spans kept or rewritten, the rest escaped.

    Every run of backticks is found once; a span closes at the next run of
    the same length before a blank line, so this stays linear in ``text``."""
    runs = list(_TICKS.finditer(text))
    of_length: dict[int, list[int]] = {}
    for k, run in enumerate(runs):
        of_length.setdefault(len(run[0]), []).append(k)
    blanks = [m.start() for m in _BLANK_LINE.finditer(text)]
    out, pos = [], 0
    for k, run in enumerate(runs):
        start, ticks = run.start(), run[0]
        if start < pos:
            continue
        if _escaped(text, start):  # the first tick is literal; the rest may open
            start, ticks = start + 1, ticks[1:]
        same = of_length.get(len(ticks), [])
        later = bisect_right(same, k)
        if not ticks or later == len(same):
            continue
        closing = runs[same[later]]
        blank = bisect_left(blanks, start)
        if blank < len(blanks) and blanks[blank] < closing.start():
            continue
        out += [_text(text[pos:start]), _code_span(ticks, text[run.end() : closing.start()])]
        pos = closing.end()
    return "".join([*out, _text(text[pos:])])


def _escaped(text: str, index: int) -> bool:
    """Whether an odd number of backslashes precede ``index``."""
    j = index
    while j > 0 and text[j - 1] == "\\":
        j -= 1
    return (index - j) % 2 == 1


def _code_span(ticks: str, content: str) -> str:
    if "<" not in content and "&" not in content:
        return ticks + content + ticks
    shown = content.replace("\n", " ")
    if len(shown) > 1 and shown[0] == shown[-1] == " " and shown.strip():
        shown = shown[1:-1]
    # every punctuation character as a reference: shown as itself, never markup
    return "<code>" + "".join(_reference(ch) for ch in shown) + "</code>"


def _reference(ch: str) -> str:
    return f"&#{ord(ch)};" if ch.isascii() and not ch.isalnum() and ch != " " else ch


def _text(text: str) -> str:
    """Prose outside code: image targets shown, then escaped."""
    return _escape(_show_targets(text))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")
