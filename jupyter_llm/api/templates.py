"""Ollama's per-request ``template`` is a Go template. We render the subset that
prompt templates use: ``{{ .System }}``, ``{{ .Prompt }}``, ``{{ .Response }}``,
``{{ if .X }}...{{ else }}...{{ end }}`` and the ``{{-``/``-}}`` trim markers.
Anything else is refused with the construct named, never mis-rendered.

The template comes from the request, so reading it is bounded by its shape:
actions are found with a left-to-right scan (each character looked at a
fixed number of times, whatever the braces), an unclosed ``{{`` is an error,
``if`` blocks nest at most ``MAX_NESTING`` deep, and what it renders is
counted as it grows: ``{{ .Prompt }}`` written many times may not make a
prompt longer than ``TEMPLATE_RENDER`` (a template of a few kilobytes could
otherwise ask the server for gigabytes)."""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import TEMPLATE_RENDER

_FIELDS = ("System", "Prompt", "Response")
MAX_NESTING = 32


def render_go_template(
    template: str, values: dict[str, str], limit: int = TEMPLATE_RENDER.value
) -> str:
    """``template`` rendered with ``values``, at most ``limit`` characters."""
    tokens = _tokenize(template)
    out, _ = _render(tokens, 0, _Output(values, limit), top=True)
    return out


@dataclass
class _Output:
    """The values, and the UTF-8 bytes rendered so far against the limit."""

    values: dict[str, str]
    limit: int
    length: int = 0

    def add(self, out: list[str], text: str, emit: bool) -> None:
        if not emit:  # inside the branch an if does not take
            return
        self.length += len(text) if text.isascii() else len(text.encode(errors="replace"))
        if self.length > self.limit:
            error = TEMPLATE_RENDER.exceeded("template", None)
            raise InvalidRequest(f"{error}: it renders a prompt longer than that")
        out.append(text)


def _tokenize(template: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) pieces, with trim markers applied."""
    pieces: list[tuple[str, str]] = []
    pos = 0
    while (start := template.find("{{", pos)) >= 0:
        end = template.find("}}", start + 2)
        if end < 0:
            raise InvalidRequest(f"template has an unclosed {{{{ at character {start}")
        text, body = template[pos:start], template[start + 2 : end]
        trim_left = body.startswith("-")
        trim_right = body.endswith("-") and len(body) > (1 if trim_left else 0)
        body = body[1 if trim_left else 0 : len(body) - 1 if trim_right else len(body)]
        pieces.append(("text", text.rstrip() if trim_left else text))
        pieces.append(("action", body.strip()))
        pos = end + 2
        if trim_right:
            while pos < len(template) and template[pos].isspace():
                pos += 1
    pieces.append(("text", template[pos:]))
    return pieces


def _field(expr: str) -> str:
    name = expr[1:] if expr.startswith(".") else ""
    if name not in _FIELDS:
        raise InvalidRequest(
            f"template uses {{{{ {expr} }}}}, which is not supported; "
            "use .System, .Prompt, .Response, if/else/end"
        )
    return name


def _render(
    tokens: list[tuple[str, str]],
    i: int,
    output: _Output,
    top: bool = False,
    depth: int = 0,
    emit: bool = True,
) -> tuple[str, int]:
    """Render from ``i`` until an ``else``/``end`` at this level (or the end);
    with ``emit`` false, only read the tokens (a branch not taken)."""
    if depth > MAX_NESTING:
        raise InvalidRequest(f"template has if blocks nested more than {MAX_NESTING} deep")
    out: list[str] = []
    while i < len(tokens):
        kind, body = tokens[i]
        if kind == "text":
            output.add(out, body, emit)
            i += 1
            continue
        if body in ("else", "end"):
            if top:
                raise InvalidRequest(f"template has an unmatched {{{{ {body} }}}}")
            return "".join(out), i
        if body.startswith("if "):
            cond = bool(output.values.get(_field(body[3:].strip()), ""))
            then, i = _render(tokens, i + 1, output, depth=depth + 1, emit=emit and cond)
            other = ""
            if i < len(tokens) and tokens[i][1] == "else":
                other, i = _render(tokens, i + 1, output, depth=depth + 1, emit=emit and not cond)
            if i >= len(tokens) or tokens[i][1] != "end":
                raise InvalidRequest("template has an {{ if }} without {{ end }}")
            out.append(then if cond else other)  # counted as it was rendered
            i += 1
            continue
        output.add(out, output.values.get(_field(body), ""), emit)
        i += 1
    if not top:
        raise InvalidRequest("template has an {{ if }} without {{ end }}")
    return "".join(out), i
