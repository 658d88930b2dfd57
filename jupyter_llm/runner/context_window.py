"""What fits in a context: slot choice, context shift, prompt and history
truncation. Plain functions over token lists and messages; the engine applies
them (BEHAVIOUR.md, "Context that never runs out").

The rules follow Ollama's runner: a sequence that reaches the end of its
context keeps its first ``num_keep`` tokens and the most recent half of the
rest; a prompt longer than the context keeps its first ``num_keep`` tokens and
its end; a chat history longer than the context drops whole messages, oldest
first, never a system message or the latest one.

Images are spans of positions (``Span``, ``[start, end)``) that no cut may
split, since an image's embeddings cannot be decoded in part: a shift keeps
an image across its head's end in the head and drops one across its
discarded part's end whole; a truncation drops whole any image that a cut
would split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_llm.request.options import DEFAULT_OPTIONS

Span = tuple[int, int]  # the positions [start, end) of one image


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class SlotView:
    """What slot choice needs to know of one idle slot."""

    index: int
    cached: Sequence[int]
    last_used: float  # monotonic time it last finished; 0: never used


def choose_slot(idle: Sequence[SlotView], prompt: Sequence[int]) -> tuple[int, int]:
    """The idle slot for ``prompt`` and how many of its cached tokens it reuses.

    The longest shared prefix wins, so a conversation's next turn finds its own
    cache even after other requests ran in between. Without any shared prefix
    the least recently used slot is taken (an empty one first), which keeps
    the caches most likely to be asked for again."""
    if not idle:
        raise ValueError("no idle slot")
    best = max(idle, key=lambda s: (common_prefix(s.cached, prompt), -s.last_used))
    shared = common_prefix(best.cached, prompt)
    if shared == 0:
        best = min(idle, key=lambda s: (s.last_used, len(s.cached)))
    return best.index, shared


def num_keep(options: dict[str, Any]) -> int:
    """A request's ``num_keep`` option, else Ollama's default."""
    value = options.get("num_keep")
    return int(DEFAULT_OPTIONS["num_keep"] if value is None else value)


def keep_count(num_keep: int, n_tokens: int) -> int:
    """The leading tokens a shift or truncation keeps: ``num_keep`` (negative:
    all of the prompt, as in Ollama), never all ``n_tokens``, never below 0."""
    keep = n_tokens if num_keep < 0 else num_keep
    return max(0, min(keep, n_tokens - 1))


def inside(position: int, spans: Sequence[Span]) -> Span | None:
    """The span that ``position`` cuts (strictly inside it), if any."""
    return next((span for span in spans if span[0] < position < span[1]), None)


def shift_span(n_past: int, num_keep: int, spans: Sequence[Span] = ()) -> tuple[int, int]:
    """The positions ``[start, end)`` a context shift discards: after the
    kept head, half of what follows it. An image across the head's end stays
    in the head; one across ``end`` goes whole. ``end <= start``: no shift."""
    keep = keep_count(num_keep, n_past)
    if (cut := inside(keep, spans)) is not None:
        keep = cut[1]
    end = keep + (n_past - keep) // 2
    if (cut := inside(end, spans)) is not None:
        end = cut[1]
    return keep, min(end, n_past)


def truncation(n_tokens: int, n_ctx: int, num_keep: int, spans: Sequence[Span] = ()) -> Span:
    """Where a prompt too long for ``n_ctx`` (with room for one generated
    token) is cut: it keeps ``[0, head)`` and ``[tail, n_tokens)``, the first
    ``num_keep`` and the end. An image a cut would split is dropped whole."""
    limit = n_ctx - 1
    if n_tokens <= limit:
        return n_tokens, n_tokens
    head = min(keep_count(num_keep, n_tokens), limit - 1)
    tail = n_tokens - (limit - head)
    if (cut := inside(head, spans)) is not None:
        head = cut[0]
    if (cut := inside(tail, spans)) is not None:
        tail = cut[1]
    return head, tail


def fit_history(
    messages: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The longest tail of the chat that ``fits``, keeping every system message
    and the latest message whatever happens (if even that does not fit, the
    caller truncates the prompt itself). Whole messages only, oldest first."""
    if fits(messages):
        return messages
    droppable = [i for i, m in enumerate(messages[:-1]) if m.get("role") != "system"]

    def without(n: int) -> list[dict[str, Any]]:
        dropped = set(droppable[:n])
        return [m for i, m in enumerate(messages) if i not in dropped]

    if not droppable or not fits(least := without(len(droppable))):
        # not even the system prompt and the latest message: no search (a long
        # system message rendered and tokenized at each of its steps took a minute)
        return without(len(droppable))
    low, high = 1, len(droppable)  # the fewest drops that fit: binary search
    while low < high:
        mid = (low + high) // 2
        if fits(without(mid)):
            high = mid
        else:
            low = mid + 1
    return least if high == len(droppable) else without(high)


def swa_reusable(keep: int, pos_min: int, n_swa: int) -> int:
    """How much of a ``keep``-token cached prefix a windowed (SWA) cache can
    reuse: the next token at position ``keep`` attends back ``n_swa``
    positions, so the cache must still hold them (``pos_min``: the oldest
    position it holds, -1 if none). All of it, or nothing."""
    if n_swa <= 0 or keep <= 0:
        return keep
    if pos_min < 0 or pos_min > max(0, keep - n_swa):
        return 0
    return keep
