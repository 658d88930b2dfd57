"""GBNF grammars that make a model's tool calls valid: the call syntax of its
format (``ChatFormat.tool_calls``), the name one of the offered tools, and
the arguments that tool's parameter schema (``jupyter_llm.grammar.json_schema``).

With ``tool_choice`` "auto" the grammar is lazy: the model writes freely
until it opens a call (a trigger pattern matches its output), and from the
trigger on it is held to the grammar, which starts with the trigger's text.
(For gpt-oss the trigger is the end of a header addressed to a function, so
the name is the model's and the arguments any offered tool's.) A trigger
must end where a token ends or the text after it in that token must fit the
grammar, as with llama.cpp's own lazy grammars; markers that are single
control tokens (``<tool_call>`` in Qwen's vocabulary, ``[TOOL_CALLS]``,
``<|python_tag|>``, ``<|message|>``) always do.
With "required" or a named tool the grammar holds from the first token; a
model that may think gets its thinking block first (that text may not hold
the first two characters of the closing marker, or a doubled first one).
One call per answer unless ``parallel``; after the call only the end of
generation is allowed.

The tools' parameter schemas form one grammar, built within one
``GrammarBudget`` (the server refused tools beyond ``SchemaLimits`` before
they got here; the budget is the runner's own bound, for what a ``$ref`` or
a merge spells out): counts above the cap are left open, and
``GrammarTooLarge`` (a ``ValueError``) is raised past the budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_llm.chat_formats import harmony
from jupyter_llm.chat_formats.detect import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
    ChatFormat,
)
from jupyter_llm.grammar.gbnf import GrammarBudget, literal
from jupyter_llm.grammar.json_schema import Converter

CHOICES = ("auto", "none", "required")
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}/")


@dataclass(frozen=True)
class ToolGrammar:
    """A grammar (start rule ``root``) and, when ``lazy``, the ECMAScript
    regular expressions that switch it on (``trigger_patterns``, as
    llama.cpp's ``llama_sampler_init_grammar_lazy_patterns`` takes them) and
    the marker texts whose single tokens do too (``trigger_words``)."""

    grammar: str
    lazy: bool
    trigger_patterns: tuple[str, ...] = ()
    trigger_words: tuple[str, ...] = ()


def tool_names(tools: Sequence[Any] | None) -> list[str]:
    """The names of the offered tools (``{"type": "function", "function": {...}}``)."""
    names = []
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def resolve_tool_choice(tool_choice: Any, tools: Sequence[Any] | None) -> str:
    """``tool_choice`` as "auto", "none", "required" or the name of one
    tool. Accepts ``{"name": N}`` and OpenAI's ``{"type": "function",
    "function": {"name": N}}``; ``ValueError`` (a 400) for anything else or
    a name not among ``tools``."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ValueError(
                f'tool_choice must be one of {", ".join(CHOICES)} or {{"name": ...}}, '
                f"not {tool_choice!r}"
            )
        if tool_choice == "required" and not tools:
            raise ValueError('tool_choice "required" needs tools')
        return tool_choice
    if isinstance(tool_choice, dict):
        target = tool_choice.get("function", tool_choice)
        name = target.get("name") if isinstance(target, dict) else None
        if isinstance(name, str) and name:
            if name not in tool_names(tools):
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools given")
            return name
    raise ValueError('tool_choice must be "auto", "none", "required" or {"name": "TOOL"}')


def regex_escape(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def call_syntax(fmt: ChatFormat, chat_template: str) -> str:
    """The syntax to constrain calls to: the format's, with Mistral's split
    into the JSON list (``[TOOL_CALLS][{...}]``) and the newer
    ``[TOOL_CALLS]name[ARGS]{...}`` its template renders."""
    if fmt.tool_calls == "mistral" and "[ARGS]" in (chat_template or ""):
        return "mistral_args"
    return fmt.tool_calls


def tool_grammar(
    fmt: ChatFormat,
    tools: Sequence[Any],
    choice: str,
    *,
    syntax: str | None = None,
    starts_in_thinking: bool = False,
    may_think: bool = True,
    parallel: bool = False,
) -> ToolGrammar | None:
    """The grammar for ``tools`` under ``choice`` (``resolve_tool_choice``);
    None when nothing is constrained ("none", or no tools). ``may_think``:
    the request lets a thinking model think first (not ``think: false``)."""
    names = tool_names(tools)
    if choice == "none" or not names:
        return None
    syntax = syntax or fmt.tool_calls
    g = _Builder()
    offered = [t for t in tools if isinstance(t, dict) and tool_names([t])]
    if choice not in ("auto", "required"):
        offered = [t for t in offered if tool_names([t]) == [choice]]
    calls = []
    for i, tool in enumerate(offered):
        function = tool.get("function", tool)
        # no parameters (or {}): a function without arguments, as OpenAI reads it
        params = function.get("parameters") or {"type": "object", "properties": {}}
        args = g.arguments(params, f"tools[{i}].function.parameters", function["name"])
        calls.append((function["name"], args))
    lazy = choice == "auto"
    one = g.call(syntax, calls, lazy)
    many = f"{one} (gap {one})*" if parallel and syntax not in ("gpt_oss",) else one
    if syntax == "mistral":
        obj = g.object_alternatives(calls, "arguments")
        many = f'"[TOOL_CALLS]" ws "[" ws {obj} ' + (f'("," ws {obj})* "]"' if parallel else '"]"')
    if lazy:
        g.rules["root"] = many
        patterns, words = _triggers(syntax)
        return ToolGrammar(g.text(), True, patterns, words)
    g.rules["root"] = f"{_thinking_prefix(g, fmt, starts_in_thinking, may_think)}{many}"
    return ToolGrammar(g.text(), False)


def _triggers(syntax: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    bare_json = r"^\s*(\{[\s\S]*)$"
    words: tuple[str, ...] = {
        "hermes": ("<tool_call>",),
        "llama3": ("<|python_tag|>",),
        "mistral": ("[TOOL_CALLS]",),
        "mistral_args": ("[TOOL_CALLS]",),
        "gpt_oss": (),
        "deepseek_r1": (DEEPSEEK_CALLS_BEGIN,),
    }.get(syntax, ("<tool_call>",))
    patterns = [regex_escape(w) for w in words]
    if syntax == "gpt_oss":
        # the end of a header addressed to a function (the recipient before or
        # after the channel): ``<|message|>`` is one token in gpt-oss's
        # vocabulary, so the text the grammar is fed from is exactly it
        patterns.append(
            r"to=functions\.[^<\s]+[^<]*(?:<\|channel\|>[^<]*)?"
            r"(?:<\|constrain\|>[^<]*)?(<\|message\|>)"
        )
    if syntax in ("llama3", "json"):
        patterns.append(bare_json)
    return tuple(patterns), words


def _thinking_prefix(
    g: _Builder, fmt: ChatFormat, starts_in_thinking: bool, may_think: bool
) -> str:
    if fmt.thinking == "tags":
        g.rules["think-text"] = _text_without(fmt.think_close)
        close = f"think-text {literal(fmt.think_close)} gap "
        if starts_in_thinking:
            return close
        if may_think:
            return f"({literal(fmt.think_open)} gap {close})? "
    if fmt.thinking == "harmony":
        g.rules["think-text"] = _text_without("<|")
        analysis = f"{harmony.CHANNEL}analysis{harmony.MESSAGE}"
        return f'({literal(analysis)} think-text "<|end|>" "<|start|>assistant")? '
    return ""


def _text_without(marker: str) -> str:
    """Text in which ``marker`` cannot start (see the module's note)."""
    first = _class(marker[0])
    if len(marker) == 1:
        return f"[^{first}]*"
    second = _class(marker[1])
    return f"([^{first}] | {literal(marker[0])} [^{second}{first}])*"


def _class(ch: str) -> str:
    return "\\" + ch if ch in "\\]-^[" else ch


class _Builder:
    def __init__(self) -> None:
        # whitespace is bounded (as llama.cpp's tool grammars bound theirs):
        # where any amount is allowed, a model that likes blanks (a random
        # one, or one whose sampling flattened its choice) pads until its
        # budget is spent and the call never closes. ``ws``: between the call
        # object's tokens, as the arguments' own ``space``; ``gap``: around a
        # marker, as templates write it (``<tool_call>\n{...}\n</tool_call>``,
        # ``</think>\n\n``)
        self.rules: dict[str, str] = {"ws": '" "?', "gap": "[ \\n]{0,2}"}
        self._names: dict[str, str] = {}
        self.budget = GrammarBudget()  # one for every tool: they form one grammar

    def text(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in sorted(self.rules.items())) + "\n"

    def arguments(self, schema: Any, where: str, name: str) -> str:
        converter = Converter(schema, rules=self.rules, _names=self._names, budget=self.budget)
        return converter.visit(schema, where, f"{name}-args")

    def object_alternatives(self, calls: list[tuple[str, str]], key: str) -> str:
        """``{"name": N, "<key>": ARGS}`` for each tool, as one group."""
        options = [
            '"{" ws "\\"name\\"" ws ":" ws '
            f'{literal(json.dumps(name))} ws "," ws {literal(json.dumps(key))} ws ":" ws '
            f'{args} ws "}}"'
            for name, args in calls
        ]
        return "(" + " | ".join(options) + ")"

    def call(self, syntax: str, calls: list[tuple[str, str]], lazy: bool) -> str:
        def each(render: Any) -> str:
            return "(" + " | ".join(render(literal(name), args) for name, args in calls) + ")"

        if syntax == "hermes":
            obj = self.object_alternatives(calls, "arguments")
            return f'"<tool_call>" gap {obj} gap "</tool_call>"'
        if syntax == "llama3":
            return f'"<|python_tag|>"? ws {self.object_alternatives(calls, "parameters")}'
        if syntax == "mistral_args":
            return each(lambda n, a: f'"[TOOL_CALLS]" {n} "[ARGS]" ws {a}')
        if syntax == "mistral":
            return self.object_alternatives(calls, "arguments")  # wrapped by the caller
        if syntax == "gpt_oss":
            if lazy:  # triggered at the header's end, whatever it named: see _triggers
                return '"<|message|>" ws (' + " | ".join(args for _, args in calls) + ")"
            head = '"<|channel|>commentary to=functions."'
            return each(lambda n, a: f'{head} {n} " <|constrain|>json<|message|>" ws {a}')
        if syntax == "deepseek_r1":
            return each(
                lambda n, a: (
                    f"{literal(DEEPSEEK_CALLS_BEGIN + DEEPSEEK_CALL_BEGIN)} "
                    f'"function" {literal(DEEPSEEK_SEP)} {n} "\\n```json\\n" {a} gap "```" '
                    f"{literal(DEEPSEEK_CALL_END + DEEPSEEK_CALLS_END)}"
                )
            )
        obj = self.object_alternatives(calls, "arguments")
        if lazy:  # the fallback's triggers: a bare object, or Hermes tags
            return f'({obj} | "<tool_call>" gap {obj} gap "</tool_call>")'
        return obj


def format_markers(fmt: ChatFormat) -> tuple[str, ...]:
    """The control texts of ``fmt`` the output parsers read, which a real
    vocabulary may hold as special tokens (rendered as nothing unless the
    runner keeps them)."""
    found = [fmt.tool_call_start, fmt.tool_call_end, fmt.think_open, fmt.think_close]
    if fmt.tool_calls == "gpt_oss" or fmt.thinking == "harmony":
        found += [harmony.START, harmony.CHANNEL, harmony.MESSAGE, harmony.CONSTRAIN, *harmony.ENDS]
    if fmt.tool_calls == "mistral":
        found += ["[ARGS]", "[CALL_ID]"]
    if fmt.tool_calls == "llama3":
        found += ["<|python_tag|>"]
    if fmt.tool_calls == "json":
        found += ["<tool_call>", "</tool_call>"]
    if fmt.tool_calls == "deepseek_r1":
        found += [DEEPSEEK_CALL_BEGIN, DEEPSEEK_SEP, DEEPSEEK_CALL_END]
    return tuple(dict.fromkeys(m for m in found if m and m != "to=functions."))
