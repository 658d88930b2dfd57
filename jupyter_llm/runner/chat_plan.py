"""Chat planning inside the runner: a completion's prompt (the chat rendered
by the model's template, with its tools, thinking variables and images), its
grammar and how its output is read back, as the model's format says."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from jupyter_llm.chat_formats import (
    ChatFormat,
    OutputStream,
    detect_format,
    place_images,
    prompt_opens_thinking,
    template_messages,
    template_variables,
)
from jupyter_llm.chat_formats.detect import check_think
from jupyter_llm.chat_formats.tool_grammar import (
    ToolGrammar,
    call_syntax,
    format_markers,
    resolve_tool_choice,
    tool_grammar,
    tool_names,
)
from jupyter_llm.grammar.gbnf import GrammarTooLarge
from jupyter_llm.grammar.llama_rules import repetition_refusal
from jupyter_llm.runner.chat_template import request_deadline
from jupyter_llm.runner.constrained import Triggers
from jupyter_llm.runner.context_window import fit_history
from jupyter_llm.runner.protocol import Complete, InputError
from jupyter_llm.runner.vision import Part, chat_markers, decode_images, split_chat, split_plain

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.model import Model


def chat_prompt(
    engine: Engine,
    messages: list[dict[str, Any]],
    tools: Any,
    truncate: bool,
    variables: dict[str, Any] | None = None,
) -> str:
    """The chat rendered by the model's template; with ``truncate``, a history
    too long for the context loses whole messages, oldest first, keeping the
    system prompt(s) and the latest message."""

    def render(kept: list[dict[str, Any]]) -> str:
        return engine.model.render_chat(kept, tools, variables)

    with request_deadline():  # the search's renders take from one time limit
        if truncate:
            messages = fit_history(messages, lambda kept: engine.fits(render(kept)))
        return render(messages)


@dataclass(frozen=True)
class ChatSetup:
    """What one model's chat template says, worked out once per engine."""

    fmt: ChatFormat
    syntax: str  # the tool-call syntax grammars hold calls to (``call_syntax``)
    preserve: frozenset[int]  # its markers that are single control tokens


def chat_setup(model: Model) -> ChatSetup:
    template = model.chat_template or ""
    fmt = detect_format(template)
    return ChatSetup(
        fmt=fmt,
        syntax=call_syntax(fmt, template),
        preserve=model.control_tokens(format_markers(fmt)),
    )


@dataclass(frozen=True)
class ChatPlan:
    """A completion's prompt, grammar and output reader."""

    prompt: str
    grammar: str | None = None
    triggers: Triggers | None = None
    preserve: frozenset[int] = frozenset()
    reader: OutputStream | None = None
    parts: list[Part] | None = None  # the prompt as text and images, when it has images


class ChatPlanner:
    """Plans each completion of one engine; what its chat template says is
    worked out once, when a completion first needs it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._setup: ChatSetup | None = None

    @property
    def setup(self) -> ChatSetup:
        if self._setup is None:
            self._setup = chat_setup(self.engine.model)
        return self._setup

    def plan(self, request: Complete) -> ChatPlan:
        """The prompt (a chat rendered with its tools and thinking variables,
        or the prompt as given), the grammar (the request's ``grammar``, or the
        tool-call grammar) and how the output is read back. ``InputError``
        for a request the model cannot honour."""
        engine, tools, think = self.engine, request.tools or None, request.think
        is_chat = request.messages is not None
        plain_images = decode_images(request.images)
        if plain_images and is_chat:
            raise InputError("a chat's images go in its messages, not beside them")
        if not is_chat and tools is None and think is None:
            prompt = request.prompt
            parts = plain_parts(engine, prompt, plain_images)
            return ChatPlan(prompt=prompt, grammar=request.grammar, parts=parts)
        setup = self.setup
        if request.relax_think and think not in (None, False) and not setup.fmt.can_think:
            request = replace(request, think=None)
            think = None
        check_chat(setup.fmt, request)
        try:
            choice = resolve_tool_choice(request.tool_choice, tools)
            variables = template_variables(setup.fmt, think)
            marker = chat_markers()
            images: list[bytes] = []
            if request.messages is not None:
                messages, images = place_images(chat_images(request.messages), marker)
                messages = template_messages(messages, setup.fmt)
        except ValueError as e:
            raise InputError(str(e)) from None
        if images:  # a model without a projector refuses before rendering
            engine.model.require_vision()
        if request.messages is not None:
            prompt = chat_prompt(engine, messages, tools, request.truncate, variables)
            parts = split_chat(prompt, marker, images) if images else None
        else:
            prompt = request.prompt
            parts = plain_parts(engine, prompt, plain_images)
        return self.constrain(request, choice, prompt, parts)

    def constrain(
        self, request: Complete, choice: Any, prompt: str, parts: list[Part] | None
    ) -> ChatPlan:
        """The plan for a rendered prompt: its grammar (the tool-call grammar
        unless a format holds with ``"auto"``) and the reader of its output."""
        setup, tools, think = self.setup, request.tools or None, request.think
        fmt, grammar = setup.fmt, request.grammar
        starts_in_thinking = prompt_opens_thinking(prompt, fmt)
        triggers = None
        constrained = False  # a tool-call grammar holds the output
        if tools and choice != "none" and not (grammar and choice == "auto"):
            # a required call wins over a format; with "auto" the format holds
            built = tools_grammar(
                fmt,
                tools,
                choice,
                syntax=setup.syntax,
                starts_in_thinking=starts_in_thinking,
                may_think=think is not False,
                parallel=request.parallel_tool_calls,
            )
            if built is not None:
                grammar, constrained = built.grammar, True
                if built.lazy:
                    words = sorted(self.engine.model.control_tokens(built.trigger_words))
                    triggers = Triggers(patterns=built.trigger_patterns, tokens=tuple(words))
        reader = None
        if tools or fmt.can_think:
            reader = OutputStream(
                fmt,
                tools=bool(tools),
                starts_in_thinking=starts_in_thinking,
                split_thinking=fmt.can_think,
                tool_names=tool_names(tools),
                constrained=constrained,
            )
        preserve = setup.preserve if reader else frozenset()
        return ChatPlan(prompt, grammar, triggers, preserve, reader, parts)


def check_chat(fmt: ChatFormat, request: Complete) -> None:
    """``InputError`` for tools or thinking the model's format cannot honour."""
    model = f'"{request.model}"' if request.model else "this model"
    if request.tools and not fmt.accepts_tools:
        raise InputError(f"{model} does not support tools")
    try:
        check_think(request.think)  # before "does not support thinking", which would hide it
    except ValueError as e:
        raise InputError(str(e)) from None
    if request.think not in (None, False) and not fmt.can_think:
        raise InputError(f"{model} does not support thinking")


def chat_images(messages: Any) -> list[dict[str, Any]]:
    """The chat with each message's ``images`` decoded (base64 → bytes)."""
    out = []
    for i, message in enumerate(list(messages)):
        if isinstance(message, dict) and message.get("images"):
            message = {
                **message,
                "images": decode_images(message["images"], f"messages[{i}].images"),
            }
        out.append(message)
    return out


def plain_parts(engine: Engine, prompt: str, images: list[bytes]) -> list[Part] | None:
    """A plain prompt with images as parts (None without images): at its
    markers (mtmd's), else first."""
    if not images:
        return None
    return split_plain(prompt, engine.model.image_marker, images)


def tools_grammar(fmt: ChatFormat, tools: list[Any], choice: Any, **how: Any) -> ToolGrammar | None:
    """``tool_grammar``, its refusals as the client's error: the server bounds
    the tools' schemas (``check_tools``), but only here are they spelled out,
    and a ``$ref`` or ``allOf`` may spell out more than the schema shows."""
    try:
        grammar = tool_grammar(fmt, tools, choice, **how)
    except GrammarTooLarge as e:
        raise InputError(f"invalid tools: {e}") from None
    except RecursionError:
        raise InputError("invalid tools: the schemas' allOf/anyOf/$ref nest without end") from None
    if grammar is not None and (why := repetition_refusal(grammar.grammar)):
        raise InputError(f"invalid tools: their grammar nests repeats past llama.cpp: {why}")
    return grammar
