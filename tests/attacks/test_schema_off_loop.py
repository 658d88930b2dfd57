"""Schemas at their limits are checked against the meta-schema, turned into a
grammar and, once the model has answered, validated against the output, all
off the event loop: another user's /api/tags keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import json

import pytest
from harness import MAX_SLOWDOWN, slowdown

from jupyter_llm.api.structured import LIMITS, parse_format


def wide_schema() -> dict:
    """An object schema with as many required, bounded properties as the
    node limit allows: the most work a schema may ask of the server."""
    count = LIMITS.max_nodes // 5
    return {
        "type": "object",
        "properties": {f"p{i:05d}": {"type": "string", "maxLength": 3} for i in range(count)},
        "required": [f"p{i:05d}" for i in range(count)],
    }


def test_the_wide_schema_is_within_the_limits():
    assert parse_format(wide_schema()) is not None


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
@pytest.mark.parametrize("path", ["api/generate", "v1/chat/completions"])
async def test_tags_answer_while_a_schema_at_its_limits_is_handled(users, installed_model, path):
    attacker, victim = users
    schema = wide_schema()
    if path == "api/generate":
        body = {
            "model": "tiny",
            "prompt": "hi",
            "stream": False,
            "format": schema,
            "options": {"num_predict": 4},
        }
    else:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "wide", "schema": schema},
            },
        }

    async def attack(running: asyncio.Event) -> tuple[int, object]:
        running.set()  # parsed and converted as soon as it arrives
        return await attacker.json(path, body)

    measured, (status, answer) = await slowdown(lambda: victim.fetch("api/tags"), attack)
    assert status == 200, json.dumps(answer)[:300]
    assert measured.ratio <= MAX_SLOWDOWN, measured
