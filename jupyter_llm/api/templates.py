"""Ollama's per-request ``template`` is a Go template. We render the subset that
prompt templates use: ``{{ .System }}``, ``{{ .Prompt }}``, ``{{ .Response }}``,
``{{ if .X }}...{{ else }}...{{ end }}`` and the ``{{-``/``-}}`` trim markers.
Anything else is refused with the construct named, never mis-rendered."""

from __future__ import annotations

import re

from jupyter_llm.errors import InvalidRequest

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_FIELDS = ("System", "Prompt", "Response")


def render_go_template(template: str, values: dict[str, str]) -> str:
    tokens = _tokenize(template)
    out, _ = _render(tokens, 0, values, top=True)
    return out


def _tokenize(template: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) pieces, with trim markers applied."""
    pieces: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(template):
        text = template[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        pieces.append(("text", text))
        pieces.append(("action", m.group(2)))
        pos = m.end()
        if m.group(3):
            rest = template[pos:]
            pos += len(rest) - len(rest.lstrip())
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
    tokens: list[tuple[str, str]], i: int, values: dict[str, str], top: bool = False
) -> tuple[str, int]:
    """Render from ``i`` until an ``else``/``end`` at this level (or the end)."""
    out: list[str] = []
    while i < len(tokens):
        kind, body = tokens[i]
        if kind == "text":
            out.append(body)
            i += 1
            continue
        if body in ("else", "end"):
            if top:
                raise InvalidRequest(f"template has an unmatched {{{{ {body} }}}}")
            return "".join(out), i
        if body.startswith("if "):
            cond = bool(values.get(_field(body[3:].strip()), ""))
            then, i = _render(tokens, i + 1, values)
            other = ""
            if i < len(tokens) and tokens[i][1] == "else":
                other, i = _render(tokens, i + 1, values)
            if i >= len(tokens) or tokens[i][1] != "end":
                raise InvalidRequest("template has an {{ if }} without {{ end }}")
            out.append(then if cond else other)
            i += 1
            continue
        out.append(values.get(_field(body), ""))
        i += 1
    if not top:
        raise InvalidRequest("template has an {{ if }} without {{ end }}")
    return "".join(out), i
