"""Which tool-call and thinking format a model speaks, read from its own
chat template.

A template shows the model, in its instructions and in how it renders past
assistant turns, the exact text of a tool call and of its thinking. The
markers it contains therefore name the format; a template we do not
recognise still gets tools (as a JSON-object fallback) when it renders them.

Templates can be hostile (a GGUF's own, or one sent to ``/api/create``, up
to the store's 4 MiB), so everything here reads a template in time linear in
its length, with ``str.find`` and ``in`` only (no regex: one C call over
4 MiB holds the GIL for up to 0.2 s, which stalls a server's event loop even
from another thread). Loops over many matches hand the GIL over every
``YIELD_EVERY`` matches. ``template_format`` caches the answer by the
template's digest; the server calls it off the event loop, a long template
read in its helper process.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

ToolCallFormat = Literal["hermes", "llama3", "mistral", "gpt_oss", "deepseek_r1", "json"]
ThinkingStyle = Literal["none", "tags", "harmony"]
Think = bool | Literal["low", "medium", "high", "max"] | None

THINK_LEVELS = ("low", "medium", "high", "max")
# a level the templates' effort variable cannot say, as the nearest it can
# (Ollama: harmony's Reasoning knows low, medium and high)
TEMPLATE_EFFORT = {"max": "high"}

# DeepSeek's markers use fullwidth bars and a "lower one eighth block" for spaces
DEEPSEEK_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
DEEPSEEK_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
DEEPSEEK_SEP = "<\uff5ctool\u2581sep\uff5c>"
DEEPSEEK_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
DEEPSEEK_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"


@dataclass(frozen=True)
class ChatFormat:
    """What one template says about tool calls and thinking.

    ``tool_call_start`` / ``tool_call_end`` are the markers around a call
    (empty where the call is bare JSON); ``think_open`` / ``think_close``
    those around thinking. ``thinking_variable`` is the template variable
    that switches thinking (``enable_thinking``), ``effort_variable`` the
    one that sets its effort (gpt-oss's ``reasoning_effort``).
    ``tool_call_id_length`` is the length a template insists tool-call ids
    have (Mistral's 9), 0 for any.
    """

    tool_calls: ToolCallFormat = "json"
    thinking: ThinkingStyle = "none"
    accepts_tools: bool = False
    tool_call_start: str = ""
    tool_call_end: str = ""
    think_open: str = ""
    think_close: str = ""
    thinking_variable: str = ""
    effort_variable: str = ""
    tool_call_id_length: int = 0

    @property
    def offers_tools(self) -> bool:
        """Ollama's ``tools`` capability: the template renders a tools list,
        or shows the model how a tool call is written."""
        return self.accepts_tools or self.tool_calls != "json"

    @property
    def can_think(self) -> bool:
        return self.thinking != "none"

    @property
    def can_disable_thinking(self) -> bool:
        return bool(self.thinking_variable)


FALLBACK = ChatFormat()

COMMENT_OPEN, COMMENT_CLOSE = "{#", "#}"
CACHE_SIZE = 256  # distinct templates remembered: far more than a server holds models
YIELD_EVERY = 256  # matches (about 0.1 ms) between two GIL hand-overs
WINDOW = 1 << 16  # characters one C search (or encode) takes at once: well under a ms
LONG_TEMPLATE = 1 << 14  # characters past which ``template_format`` reads by ``read_long``

_cache: OrderedDict[bytes, ChatFormat] = OrderedDict()
_cache_lock = threading.Lock()


def _find(text: str, needle: str, start: int = 0) -> int:
    """``text.find(needle, start)``, a window at a time with the GIL handed
    over between windows (one search over 4 MiB holds it for up to 5 ms)."""
    overlap = len(needle) - 1  # a match that starts in a window may end past it
    while start < len(text):
        stop = start + WINDOW
        found = text.find(needle, start, stop + overlap)
        if found >= 0 or stop >= len(text):
            return found
        start = stop
        time.sleep(0)  # hand the GIL to the event loop if it waits
    return text.find(needle, start)  # past the end: what str.find answers there


def _uses(template: str, *markers: str) -> bool:
    return any(_find(template, m) >= 0 for m in markers)


def strip_comments(template: str) -> str:
    """``template`` without its Jinja comments (``{# ... #}``), so that a
    marker a comment mentions does not count.

    One forward scan: each search starts where the last one ended, so every
    character is looked at a bounded number of times (a lazy regex retried at
    each of N unclosed ``{#`` is N^2). A ``{#`` never closed comments out
    the rest: Jinja refuses such a template, so nothing after it renders.
    """
    kept: list[str] = []
    pos = 0
    find = partial(_find, template)
    while True:
        for _ in range(YIELD_EVERY):
            start = find(COMMENT_OPEN, pos)
            if start < 0:
                if not pos:  # no comment: no copy
                    return template
                kept.append(template[pos:])
                return "".join(kept)
            if start > pos:
                kept.append(template[pos:start])
            end = find(COMMENT_CLOSE, start + len(COMMENT_OPEN))
            if end < 0:
                return "".join(kept)
            pos = end + len(COMMENT_CLOSE)
        time.sleep(0)  # hand the GIL to the event loop if it waits


def _is_word(text: str, i: int) -> bool:
    """Whether ``text[i]`` is a word character as regex ``\\w`` has it."""
    return 0 <= i < len(text) and (text[i].isalnum() or text[i] == "_")


def _has_word(text: str, word: str) -> bool:
    """Whether ``word`` occurs in ``text`` as a whole word (regex ``\\b`` on
    each side that borders a word character), in one forward scan."""
    pos = 0
    while True:
        for _ in range(YIELD_EVERY):
            start = _find(text, word, pos)
            if start < 0:
                return False
            end = start + len(word)
            bounded_before = not (_is_word(text, start) and _is_word(text, start - 1))
            if bounded_before and not _is_word(text, end):
                return True
            pos = start + 1
        time.sleep(0)  # hand the GIL to the event loop if it waits


def _mentions_tools(text: str) -> bool:
    """Jinja's ``tools`` variable, or Ollama's Go-template ``.Tools`` (a
    template given to ``/api/create``)."""
    return _has_word(text, "tools") or _has_word(text, ".Tools")


def detect_format(chat_template: str) -> ChatFormat:
    """The format of the model whose chat template is ``chat_template``."""
    text = strip_comments(chat_template or "")
    accepts_tools = _mentions_tools(text)
    tools = _tool_format(text)
    thinking = _thinking(text)
    return ChatFormat(
        accepts_tools=accepts_tools,
        tool_call_id_length=9 if _uses(text, "length != 9", "length 9") else 0,
        **tools,
        **thinking,
    )


def template_digest(chat_template: str) -> bytes:
    """The sha256 of the template's UTF-8 text (a lone surrogate, which a
    GGUF string may decode to, passes through rather than failing)."""
    digest = hashlib.sha256()
    for i in range(0, len(chat_template), WINDOW):  # hashlib lets go of the GIL
        digest.update(chat_template[i : i + WINDOW].encode("utf-8", "surrogatepass"))
    return digest.digest()


def template_format(
    chat_template: str, read_long: Callable[[str], ChatFormat] | None = None
) -> ChatFormat:
    """``detect_format``, worked out once per template digest and kept in a
    bounded LRU (by digest, so the cache never holds the templates).

    Reading a hostile 4 MiB template takes up to seconds of pure Python: a
    server calls this off its event loop, and passes ``read_long`` to read a
    template longer than ``LONG_TEMPLATE`` where it shares no GIL with the
    loop (its helper process); shorter ones are read here."""
    key = template_digest(chat_template or "")
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    long = read_long is not None and len(chat_template) > LONG_TEMPLATE
    # outside the lock: others' look-ups go on
    fmt = read_long(chat_template) if long else detect_format(chat_template)
    with _cache_lock:
        _cache[key] = fmt
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return fmt


def clear_template_cache() -> None:
    """Forget every cached format (tests measure the uncached path)."""
    with _cache_lock:
        _cache.clear()


def _tool_format(text: str) -> dict[str, str]:
    if _uses(text, "<|channel|>") and _uses(text, "<|start|>"):
        return {
            "tool_calls": "gpt_oss",
            "tool_call_start": "to=functions.",
            "tool_call_end": "<|call|>",
        }
    if _uses(text, "[TOOL_CALLS]"):
        return {"tool_calls": "mistral", "tool_call_start": "[TOOL_CALLS]"}
    if _uses(text, DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALL_BEGIN):
        return {
            "tool_calls": "deepseek_r1",
            "tool_call_start": DEEPSEEK_CALLS_BEGIN,
            "tool_call_end": DEEPSEEK_CALLS_END,
        }
    if _uses(text, "<tool_call>"):
        return {
            "tool_calls": "hermes",
            "tool_call_start": "<tool_call>",
            "tool_call_end": "</tool_call>",
        }
    if _uses(text, "<|python_tag|>", "ipython<|end_header_id|>", '"parameters": dictionary'):
        return {"tool_calls": "llama3", "tool_call_start": "<|python_tag|>"}
    return {"tool_calls": "json"}


def _thinking(text: str) -> dict[str, str]:
    if _uses(text, "<|channel|>") and _uses(text, "analysis"):
        return {
            "thinking": "harmony",
            "think_open": "<|channel|>analysis<|message|>",
            "think_close": "<|end|>",
            "effort_variable": "reasoning_effort" if _uses(text, "reasoning_effort") else "",
        }
    if _uses(text, "[THINK]") and _uses(text, "[/THINK]"):  # Mistral's reasoning models
        return {"thinking": "tags", "think_open": "[THINK]", "think_close": "[/THINK]"}
    if _uses(text, "<think>") or _uses(text, "</think>"):
        return {
            "thinking": "tags",
            "think_open": "<think>",
            "think_close": "</think>",
            "thinking_variable": "enable_thinking" if _uses(text, "enable_thinking") else "",
        }
    return {}


def prompt_opens_thinking(prompt: str, fmt: ChatFormat) -> bool:
    """Whether the rendered ``prompt`` already opened a thinking block (the
    generation prompt ends in ``<think>``), so that the output starts inside
    thinking and only closes it."""
    if fmt.thinking != "tags":
        return False
    opened = prompt.rfind(fmt.think_open)
    return (
        opened >= 0
        and prompt.find(fmt.think_close, opened) < 0
        and not prompt[opened + len(fmt.think_open) :].strip()
    )


def check_think(think: object) -> None:
    """``ValueError`` unless ``think`` is None, a boolean or a level."""
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        raise ValueError(f"think must be true, false or one of {', '.join(THINK_LEVELS)}")


def template_variables(fmt: ChatFormat, think: Think) -> dict[str, object]:
    """The extra variables to render the template with for Ollama's
    ``think`` (or OpenAI's ``reasoning_effort``): true, false, a level, or
    None for the template's default (which, for a template that reads
    ``enable_thinking``, may be either: Qwen3 thinks unless told not to,
    DeepSeek-V3.1 only when told to).

    Raises ``ValueError`` (a 400) for a request the template cannot honour:
    thinking from a model that has none, or ``think: false`` from one that
    cannot turn it off.
    """
    check_think(think)
    if think is None:  # the template's own default
        return {}
    if not fmt.can_think:
        if think is False:
            return {}
        raise ValueError("this model does not support thinking")
    if think is False:
        if not fmt.can_disable_thinking:
            raise ValueError("this model cannot turn thinking off: its chat template always thinks")
        return {fmt.thinking_variable: False}
    variables: dict[str, object] = {}
    if fmt.thinking_variable:
        variables[fmt.thinking_variable] = True
    if fmt.effort_variable and isinstance(think, str):
        variables[fmt.effort_variable] = TEMPLATE_EFFORT.get(think, think)
    return variables
