"""A request's priority: ``interactive`` (someone waits for it: ``%%llm``,
chat, the CLI, the sidebar, plain API calls) or ``batch`` (``map()``,
``%%llm --map``, or any API request that says so).

Interactive requests take the next free slot before any batch request, and
may pause a batch sequence in the runner (``runner.pausing``); batch work is
never starved for good (``scheduler.priority`` and ``runner.pausing`` bound
it). A client sets it in the body (``"priority": "batch"``) or, for clients
that cannot add body fields (OpenAI's SDK sends ``extra_headers``), in the
``X-LLM-Priority`` header; the body wins where both are given.
"""

from __future__ import annotations

from typing import Any

INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)  # in the order their requests are served
HEADER = "X-LLM-Priority"
MAX_SEQ_IDS = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids one context may hold


def parse_priority(value: Any, where: str = "priority") -> str | None:
    """``value`` as a priority (None: not given); a ``ValueError`` naming
    ``where`` for anything else. Only the two names are taken, so a typo such
    as ``"bacth"`` fails rather than silently running interactive."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in PRIORITIES:
        shown = repr(value)[:64]  # bounded: an error never echoes a whole body
        raise ValueError(f'{where} must be "interactive" or "batch", not {shown}')
    return value


def resolve(body_value: str | None, header_value: str | None) -> str:
    """The request's priority: the body's, else the header's, else interactive."""
    if body_value is not None:
        return body_value
    from_header = parse_priority(header_value.strip() if header_value else None, HEADER)
    return from_header or INTERACTIVE


def rank(priority: str) -> int:
    """Sort key: interactive (0) before batch (1)."""
    return 1 if priority == BATCH else 0


def spare_ids(slots: int) -> int:
    """Sequence ids a runner's context holds beyond its ``slots`` decode
    slots, for paused batch sequences (``runner.pausing``): one per slot, so
    every slot's batch sequence may be paused, within llama.cpp's bound."""
    return max(0, min(slots, MAX_SEQ_IDS - slots))


def decode_slots(asked: int) -> int:
    """The decode slots a context gets for ``asked`` (``num_parallel``): at
    least one, within llama.cpp's bound on sequence ids."""
    return max(1, min(asked, MAX_SEQ_IDS))


def seq_ids(slots: int) -> int:
    """All the sequence ids of a context with ``slots`` decode slots."""
    n = decode_slots(slots)
    return n + spare_ids(n)
