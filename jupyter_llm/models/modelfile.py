"""Ollama's Modelfile: ``FROM``, ``PARAMETER``, ``TEMPLATE``, ``SYSTEM``,
``MESSAGE``, ``LICENSE``, parsed into the fields of an ``/api/create`` request.
A second ``FROM`` naming a ``.gguf`` file adds that file (a vision model's
projector, as in Ollama, where every file ``FROM`` joins ``files``).
``DRAFT`` (ours, at most one) names a draft model for speculative decoding,
resolved as ``FROM`` is: a model name, or a path to a ``.gguf`` file.

A ``PARAMETER`` is checked here against the option table, types and ranges
as a request's options are, so a bad one is refused with its line number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.options import OPTION_TYPES, check_option

COMMANDS = ("from", "draft", "parameter", "template", "system", "message", "license", "adapter")
ROLES = ("system", "user", "assistant")


@dataclass
class Modelfile:
    source: str  # FROM: a model name or a path to a .gguf file
    more_files: list[str] = field(default_factory=list)  # later FROM files (a projector)
    parameters: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    draft: str | None = None  # DRAFT: a model name or a path to a .gguf file

    @property
    def from_file(self) -> bool:
        return is_file_source(self.source)

    @property
    def draft_file(self) -> bool:
        return self.draft is not None and is_file_source(self.draft)

    def create_request(self, model: str) -> dict[str, Any]:
        """The /api/create body (``from``/``draft`` for a model; files are the caller's job)."""
        body: dict[str, Any] = {"model": model}
        if not self.from_file:
            body["from"] = self.source
        if self.draft is not None and not self.draft_file:
            body["draft"] = self.draft
        for key in ("template", "system"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        if self.parameters:
            body["parameters"] = self.parameters
        if self.messages:
            body["messages"] = self.messages
        if self.license:
            body["license"] = self.license
        return body


def is_file_source(source: str) -> bool:
    """Does a ``FROM`` name a file (rather than a model)?"""
    return source.lower().endswith(".gguf") or (
        "/" in source and (source.startswith((".", "/", "~")))
    )


def parse_modelfile(text: str) -> Modelfile:
    source = None
    out = Modelfile(source="")
    for line in _commands(text):
        lineno, command, args = line.lineno, line.command, line.args
        if command == "from" and source is None:
            source = args
        elif command == "from":
            if not (is_file_source(source) and is_file_source(args)):
                raise InvalidRequest(
                    f"Modelfile line {lineno}: a second FROM must name a .gguf file "
                    "(a projector) beside a first FROM that is one"
                )
            out.more_files.append(args)
        elif command == "draft":
            if out.draft is not None:
                raise InvalidRequest(f"Modelfile line {lineno}: a second DRAFT (one draft model)")
            if not args.strip():
                raise InvalidRequest(f"Modelfile line {lineno}: DRAFT needs a model name or file")
            out.draft = args.strip()
        elif command == "parameter":
            name, _, value = args.strip().partition(" ")
            name, value = name.lower(), line.argument(value)
            if name not in OPTION_TYPES:
                raise InvalidRequest(f"Modelfile line {lineno}: unknown parameter {name!r}")
            typed = _checked(name, _typed_value(name, value, OPTION_TYPES[name][0], lineno), lineno)
            if name == "stop":
                out.parameters.setdefault("stop", []).append(typed)
            else:
                out.parameters[name] = typed
        elif command in ("template", "system"):
            setattr(out, command, args)
        elif command == "message":
            role, _, content = args.strip().partition(" ")
            if role.lower() not in ROLES:
                raise InvalidRequest(
                    f"Modelfile line {lineno}: MESSAGE role must be one of {', '.join(ROLES)}"
                )
            out.messages.append({"role": role.lower(), "content": line.argument(content)})
        elif command == "license":
            out.license.append(args)
        elif command == "adapter":
            raise InvalidRequest(f"Modelfile line {lineno}: ADAPTER is not supported")
    if not source:
        raise InvalidRequest("Modelfile has no FROM line")
    out.source = source
    return out


@dataclass
class _Line:
    """A Modelfile command and its argument. A quoted argument of PARAMETER
    or MESSAGE keeps its text exactly in ``quoted`` (``args`` is what came
    before the quote: the name or role), as Ollama trims before it unquotes."""

    lineno: int
    command: str
    args: str
    quoted: str | None = None

    def argument(self, value: str) -> str:
        """PARAMETER's value or MESSAGE's content (``value``, what followed the
        name or role on the line), trimmed, then unquoted, as Ollama reads it."""
        if self.quoted is not None:
            return self.quoted
        value = value.strip()
        return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def _commands(text: str) -> list[_Line]:
    """The commands, with quoted arguments over several lines joined."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        lineno = i + 1
        i += 1
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^(\w+)\s*(.*)$", line)
        if not m or m.group(1).lower() not in COMMANDS:
            raise InvalidRequest(f"Modelfile line {lineno}: unknown command {line.split()[0]!r}")
        command, args = m.group(1).lower(), m.group(2)
        head, body = args, None
        if '"""' in args:
            head, _, rest = args.partition('"""')
            if '"""' in rest:  # the last one closes: the text may end with '"'
                body = rest.rpartition('"""')[0]
            else:
                parts = [rest]
                while i < len(lines) and '"""' not in lines[i]:
                    parts.append(lines[i])
                    i += 1
                if i >= len(lines):
                    raise InvalidRequest(f'Modelfile line {lineno}: unterminated """')
                parts.append(lines[i].rpartition('"""')[0])
                i += 1
                body = "\n".join(parts)
        elif (opened := _open_quote(command, args)) is not None and (
            end := _closing_line(lines, i)
        ) is not None:
            # a '"' argument over lines, as Ollama writes text with newlines and
            # no '"' (the modelfile /api/show answers): it ends at a line's last '"'
            head = args[:opened]
            parts = [args[opened + 1 :], *lines[i:end], lines[end].rstrip()[:-1]]
            body = "\n".join(parts)
            i = end + 1
        elif len(args) >= 2 and args[0] == args[-1] == '"':
            body = args[1:-1]
        if body is None:
            out.append(_Line(lineno, command, args))
        elif command in ("parameter", "message"):
            out.append(_Line(lineno, command, head, body))
        else:
            out.append(_Line(lineno, command, body))
    return out


def _open_quote(command: str, args: str) -> int | None:
    """Where a '"' opens the argument's value with no '"' after it on the line
    (PARAMETER's and MESSAGE's value follows their name), or None."""
    start = args.find(" ") + 1 if command in ("parameter", "message") else 0
    if start == 0 and command in ("parameter", "message"):
        return None
    if args[start : start + 1] == '"' and '"' not in args[start + 1 :]:
        return start
    return None


def _closing_line(lines: list[str], start: int) -> int | None:
    """The line from ``start`` on that closes a '"' argument: the first with
    a '"', if that is its only one and ends it; otherwise None, and the '"'
    is taken as it is (``PARAMETER stop "``)."""
    for j in range(start, len(lines)):
        if '"' in lines[j]:
            closing = lines[j].rstrip()
            return j if closing.endswith('"') and closing.count('"') == 1 else None
    return None


def _typed_value(name: str, value: str, kind: Any, lineno: int) -> Any:
    try:
        if kind is bool:
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if kind is int:
            return int(value)
        if kind is not str and kind != (str, list) and str not in _as_tuple(kind):
            number = float(value)
            return int(number) if number.is_integer() and kind is int else number
        return value
    except ValueError:
        raise InvalidRequest(
            f"Modelfile line {lineno}: PARAMETER {name} {value!r} is not a valid value"
        ) from None


def _checked(name: str, typed: Any, lineno: int) -> Any:
    try:
        return check_option(f"PARAMETER {name}", OPTION_TYPES[name], typed)
    except ValueError as e:
        raise InvalidRequest(f"Modelfile line {lineno}: {e}") from None


def _as_tuple(kind: Any) -> tuple[Any, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
