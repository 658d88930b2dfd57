"""Attacks 3 and 5: a penalty window of 2^28 tokens (the runner grew by 1 GiB
for one request) and a million stop strings (another user's 10-token answer
took 15 s). Both are 400s naming their limit now; at the limits, the runner's
memory and another user's answer stay within the issue's bounds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
from harness import (
    MAX_RSS_GROWTH,
    MAX_SLOWDOWN,
    TRIES,
    Slowdown,
    record,
    rss,
    rss_growth,
    runner_pids,
    slowdown,
    tiny_generate,
)

from jupyter_llm.request.limits import STOP_CHARS, STOP_STRINGS


def generate(**options) -> dict:
    return {"model": "tiny", "prompt": "hi", "stream": False, "options": options}


@pytest.mark.parametrize(
    ("path", "body", "limit"),
    [
        # the million: refused before its options are read, by the body's values
        ("api/generate", generate(stop=[f"s{i}" for i in range(1_000_000)]), "json_values"),
        ("api/generate", generate(stop=[f"s{i}" for i in range(100_000)]), "stop_strings"),
        ("api/generate", generate(stop=["x" * (STOP_CHARS.value + 1)]), "stop_chars"),
        (
            "v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "stop": ["s"] * (STOP_STRINGS.value + 1),
            },
            "stop_strings",
        ),
        ("api/generate", generate(repeat_last_n=2**28), "repeat_last_n"),
        ("api/generate", generate(repeat_last_n=2**31 - 1), "repeat_last_n"),
        # within the option's range, past this load's context: the runner refuses it
        ("api/generate", generate(repeat_last_n=8192, num_ctx=256), "repeat_last_n"),
    ],
    ids=[
        "a million stops",
        "100k stops",
        "a long stop",
        "openai stops",
        "2^28",
        "2^31-1",
        "past num_ctx",
    ],
)
async def test_beyond_a_sampling_bound_is_a_400_naming_it(
    users, installed_model, path, body, limit
):
    attacker, _ = users
    status, answer = await attacker.json(path, body)
    assert status == 400, answer
    assert limit in json.dumps(answer), answer


async def test_a_penalty_window_of_the_whole_context_costs_the_runner_little(
    users, installed_model, jp_serverapp
):
    attacker, _ = users
    status, answer = await attacker.json("api/generate", generate(num_predict=1))
    assert status == 200, answer
    (pid,) = runner_pids(jp_serverapp)
    before = rss(pid)
    for _ in range(3):  # -1: the whole context, as Ollama means it
        status, answer = await attacker.json(
            "api/generate", generate(repeat_last_n=-1, repeat_penalty=1.1, num_predict=8)
        )
        assert status == 200, answer
    assert runner_pids(jp_serverapp) == [pid]
    assert rss_growth(pid, before) < MAX_RSS_GROWTH


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
async def test_stops_at_their_limits_leave_another_users_answer_within_2x(users, installed_model):
    """64 stops of 256 characters each, all near-misses of what the model
    writes, checked after every token of a long generation beside the victim.

    What the stops cost is measured against the same generation without
    them: a long stream beside the victim already shares every decode step
    with it (and its drafts widen those steps), which costs the victim about
    2x its time alone on 2 cores whatever the stops. The bound is on what the
    stops add; a freeze (the original attack's 15 s) shows either way."""
    attacker, victim = users
    count = STOP_STRINGS.value
    stops = [("a" * (STOP_CHARS.value // count - 4)) + f"{i:04d}" for i in range(count)]
    options = {"num_predict": 600, "temperature": 0}
    with_stops = {"model": "tiny", "prompt": "a a a a", "stream": True, "options": options}
    with_stops["options"] = {**options, "stop": stops}
    plain = {**with_stops, "options": options}

    def attack(body: dict) -> Callable[[asyncio.Event], Awaitable[tuple[int, list]]]:
        return lambda running: attacker.stream("api/generate", body, running)

    def answer() -> Awaitable:
        return victim.json("api/generate", tiny_generate())

    best = None
    for _ in range(TRIES):  # a pair over the bound is taken again (``slowdown``'s reason)
        control, _ = await slowdown(answer, attack(plain), tries=1)
        measured, (status, lines) = await slowdown(answer, attack(with_stops), tries=1)
        assert status == 200, lines
        assert lines[-1]["done"], lines[-1]
        added = Slowdown(max(control.during, control.baseline), measured.during, measured.samples)
        record(f"victim beside the stops against beside the plain stream: {added}")
        if best is None or added.ratio < best.ratio:
            best = added
        if added.ratio <= MAX_SLOWDOWN:
            break
    assert best is not None and best.ratio <= MAX_SLOWDOWN, best
