"""Whether a value is small enough as JSON to encode on the event loop,
found in a bounded number of steps (both ways: what goes to a runner, and an
answer going to a client)."""

from __future__ import annotations

from typing import Any


def small(value: Any, budget: int) -> bool:
    """Is ``value`` surely under ``budget`` bytes as JSON? Counted until it is
    not (each value at least a few bytes), so the count costs at most a few
    thousand steps, however large the value."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            budget -= len(item) + 2
        elif isinstance(item, dict | list | tuple):
            budget -= 8 * len(item)
            if budget >= 0:
                stack.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
        else:
            budget -= 8
        if budget < 0:
            return False
    return True
