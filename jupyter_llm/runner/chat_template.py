"""A GGUF's chat template (Jinja), rendered with bounded work.

The template is code from whoever made the model file. A loop of 10^10 steps
or a string doubled forty times would hold the runner's main thread, or its
memory, for good; and a Python thread cannot be killed, so a deadline on a
worker thread would leave the work running. The bounds therefore sit inside
the render, in the calling thread:

- steps and time: a trace function counts the Python lines the render runs
  (the template's loops and macros, the filters it calls) and stops it past
  ``MAX_STEPS`` or ``TIME_LIMIT`` seconds;
- size: every value the template builds (``*``, ``**``, ``+``, ``%``, ``~``,
  calls, filters, slices, the output) is charged to a character budget, and
  an operation that would go over it is refused *before* it runs, so no
  single C-level operation can take long or take much memory.

Over a bound the request fails as ``InputError`` (HTTP 400), naming it; the
runner goes on. The environment is the one llama-cpp-python's
``Jinja2ChatFormatter`` uses (Transformers' chat-template settings), its
extension and ``tojson`` reused rather than redone.
"""

from __future__ import annotations

import contextvars
import functools
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator, Frame
from jinja2.filters import do_format
from jinja2.nodes import Concat, Getitem, Slice
from jinja2.sandbox import ImmutableSandboxedEnvironment

from jupyter_llm.runner.protocol import InputError

MAX_STEPS = 10_000_000  # Python lines; a 10,000-message chat takes about 200,000
TIME_LIMIT = 5.0  # seconds
MAX_CHARS = 64 << 20  # characters built, on top of 8 x what the request brought
MAX_INT_BITS = 4096  # integers a template computes with (``**``, ``*``)
# a %-format's flags, width and precision, possessive: no backtracking, so the
# search is linear however the template repeats "%" and digits
_PERCENT_SPEC = re.compile(r"%[-+ #0]*+(\d*+)(?:\.(\d*+))?")
_BRACE_FIELD = re.compile(r"\{[^{}]*+\}")  # a {}-format field without nested braces
_NINE_DIGITS = re.compile(r"\d{9}")
HUGE_DIGITS = 9  # a width or precision of 9+ digits is refused
_SIZED = (str, bytes, list, tuple, dict, set, frozenset)


class RenderLimit(BaseException):
    """A bound was reached. A ``BaseException`` so that no ``except Exception``
    in code the template calls can swallow it and let the work go on."""


_now = time.monotonic
# the renders of one request share a deadline (``request_deadline``): a
# history cut to fit the context renders the chat once per step of its search
_request_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "request_deadline", default=None
)


@contextmanager
def request_deadline(seconds: float = TIME_LIMIT) -> Iterator[None]:
    """Every render inside takes from one ``seconds``: 17 renders of a
    16,001-message chat, each within its own limit, held the runner's loop
    (and every other stream on it) for 14 s."""
    token = _request_deadline.set(_now() + seconds)
    try:
        yield
    finally:
        _request_deadline.reset(token)


class Budget:
    """What one render may still do."""

    def __init__(self, chars: int) -> None:
        self.chars_left = chars
        self.steps = 0
        self.deadline = _now() + TIME_LIMIT
        if (shared := _request_deadline.get()) is not None:
            if _now() > shared:
                raise RenderLimit(f"rendering this request's chat took longer than {TIME_LIMIT:g}s")
            self.deadline = min(self.deadline, shared)

    def expect(self, size: int) -> None:
        """Refuse to build a value of ``size`` characters (or items)."""
        if size > self.chars_left:
            raise RenderLimit(f"chat template built more than {MAX_CHARS >> 20}M characters")

    def charge(self, value: Any) -> Any:
        if isinstance(value, _SIZED):
            self.expect(len(value))
            self.chars_left -= len(value)
        return value

    def trace(self, frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise RenderLimit(f"chat template took more than {MAX_STEPS:,} steps")
        if not self.steps & 1023 and _now() > self.deadline:
            raise RenderLimit(f"chat template took longer than {TIME_LIMIT:g}s")
        return self.trace


_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("budget", default=None)


def _check_sizes(budget: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Integer arguments of string methods and filters are sizes (``ljust``,
    ``center``, ``indent``): each must fit the budget."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            budget.expect(abs(value))


def _check_format(text: Any) -> None:
    """A format string may not ask for a huge width or precision."""
    if isinstance(text, str) and _asks_huge_width(text):
        raise RenderLimit("chat template asked for a format width that is too large")


def _asks_huge_width(text: str) -> bool:
    """A width or precision of ``HUGE_DIGITS`` digits or more, in a
    %-format or after the colon of a {}-format field; linear in ``text``."""
    for spec in _PERCENT_SPEC.finditer(text):
        width, precision = spec.group(1), spec.group(2) or ""
        if len(width) >= HUGE_DIGITS or len(precision) >= HUGE_DIGITS:
            return True
    for field in _BRACE_FIELD.finditer(text):
        colon = field.group().find(":")
        if colon >= 0 and _NINE_DIGITS.search(field.group(), colon):
            return True
    return False


def _check_call(budget: Budget, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Only a string's own methods build big strings from small arguments in
    one C call (``"x".ljust(10**9)``); the template's macros and Jinja's
    globals are Python, bounded by the steps."""
    method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(method, "__self__", None)
    if not isinstance(owner, str | bytes):
        return
    if getattr(method, "__name__", "") in ("format", "format_map"):
        _check_format(owner)
    else:
        _check_sizes(budget, args, kwargs)


def _check_binop(budget: Budget, operator: str, left: Any, right: Any) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and right > 0:
        if right * max(abs(left).bit_length(), 1) > MAX_INT_BITS:
            raise RenderLimit("chat template computed a number that is too large")
    elif operator == "*" and ints:
        if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
            raise RenderLimit("chat template computed a number that is too large")
    elif operator == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, _SIZED) and isinstance(n, int):
            budget.expect(len(seq) * max(n, 0))
    elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
        budget.expect(len(left) + len(right))
    elif operator == "%" and isinstance(left, str):
        _check_format(left)
        if "*" in left:  # widths taken from the arguments
            _check_sizes(budget, right if isinstance(right, tuple) else (right,), {})


class _BoundedCodeGenerator(CodeGenerator):
    """``a ~ b`` and ``x[i:j]``, which Jinja compiles to plain Python, go
    through the environment, so that they are charged too."""

    def visit_Getitem(self, node: Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.bounded_slice(")
        self.visit(node.node, frame)
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            self.write(", ")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write(")")

    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            super().visit_Concat(node, frame)
            return
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every value-building operation charged to the
    current render's ``Budget``."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _bounded(f) for name, f in self.filters.items()}

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if budget := _budget.get():
            _check_binop(budget, operator, left, right)
            return budget.charge(super().call_binop(context, operator, left, right))
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if budget := _budget.get():
            _check_call(budget, __obj, args, kwargs)
            return budget.charge(super().call(__context, __obj, *args, **kwargs))
        return super().call(__context, __obj, *args, **kwargs)

    def bounded_slice(self, obj: Any, start: Any, stop: Any, step: Any) -> Any:
        """``obj[start:stop:step]``, a copy: its size is known before it is made."""
        part = slice(start, stop, step)
        budget = _budget.get()
        if budget is not None and isinstance(obj, _SIZED) and not isinstance(obj, dict):
            budget.expect(len(range(*part.indices(len(obj)))))
            return budget.charge(obj[part])
        return obj[part]

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        texts = [str(p) for p in parts]
        if budget := _budget.get():
            budget.expect(sum(map(len, texts)))
            return budget.charge("".join(texts))
        return "".join(texts)


def _bounded(filter_: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose size arguments are checked and whose result is charged
    (the value filtered, and a context Jinja passes first, are not sizes)."""
    skip = 2 if getattr(filter_, "jinja_pass_arg", None) is not None else 1

    @functools.wraps(filter_)  # keeps jinja_pass_arg
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget.get()
        if budget is None:
            return filter_(*args, **kwargs)
        if filter_ is do_format and len(args) >= skip:
            _check_format(args[skip - 1])  # the value is the format string
        else:
            _check_sizes(budget, args[skip:], kwargs)
        return budget.charge(filter_(*args, **kwargs))

    return bounded


def _environment() -> BoundedEnvironment:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    env = BoundedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Jinja2ChatFormatter.IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _bounded(Jinja2ChatFormatter.tojson)
    return env


_STANDARD = frozenset(
    (
        *("messages", "tools", "bos_token", "eos_token", "add_generation_prompt"),
        *("raise_exception", "strftime_now", "functions", "function_call", "tool_choice"),
    )
)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One model's chat template: compiled on first use, rendered within a
    budget every time."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template: jinja2.Template | None = None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The prompt; ``variables`` are extra template variables (such as
        ``enable_thinking`` or ``reasoning_effort``), never replacing the
        standard ones."""
        brought = sum(len(str(v)) for m in messages for v in m.values()) + len(str(tools or ""))
        try:
            with _bounded_by(Budget(MAX_CHARS + 8 * brought)) as budget:
                if self._template is None:
                    self._template = _environment().from_string(self.source)
                parts = [
                    budget.charge(piece)
                    for piece in self._generate(messages, tools, variables or {})
                ]
        except RenderLimit as e:
            raise InputError(str(e)) from None
        except Exception as e:  # template errors are the user's input problem
            raise InputError(f"chat template failed: {e}") from e
        return "".join(parts)

    def _generate(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, variables: dict[str, Any]
    ) -> Iterator[str]:
        assert self._template is not None
        return self._template.generate(
            **{k: v for k, v in variables.items() if k not in _STANDARD},
            messages=messages,
            tools=tools,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=True,
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            functions=None,
            function_call=None,
            tool_choice=None,
        )


@contextmanager
def _bounded_by(budget: Budget) -> Iterator[Budget]:
    """Charge this thread's work to ``budget`` (a tracer already set, such as
    coverage's, is put back afterwards)."""
    token = _budget.set(budget)
    previous = sys.gettrace()
    sys.settrace(budget.trace)
    try:
        yield budget
    finally:
        sys.settrace(previous)
        _budget.reset(token)
