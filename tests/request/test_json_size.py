"""``small``: whether a value (a message to a runner, an answer) is surely
small enough to encode on the event loop, found in a bounded number of steps."""

from __future__ import annotations

import json

import pytest

from jupyter_llm.request.json_size import small

BUDGET = 64 << 10


@pytest.mark.parametrize(
    ("message", "is_small"),
    [
        ({"op": "complete", "prompt": "x" * 1000}, True),
        ({"op": "complete", "prompt": "x" * BUDGET}, False),
        ({"messages": [{"role": "user", "content": "y" * 100}] * 100}, True),
        ({"messages": [{"role": "user", "content": "y" * 100}] * 1000}, False),
        ({"context": list(range(20_000))}, False),  # many small values
        ({"images": ["i" * 40_000, "j" * 40_000]}, False),
        ({"a": {"b": {"c": ["d" * 70_000]}}}, False),  # deep inside
    ],
)
def test_small_messages_are_told_apart(message, is_small):
    assert small(message, BUDGET) is is_small
    if is_small:  # it is what it promised
        assert len(json.dumps(message)) < BUDGET


def test_a_huge_message_is_judged_in_few_steps():
    values = {f"k{i}": i for i in range(1_000_000)}
    assert not small({"messages": values}, BUDGET)  # at once, by its length
