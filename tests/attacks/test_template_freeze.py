"""Attack 1: a model created with a template made of ``{#`` repeated, then
``/api/show`` on it. Its capabilities were read by a quadratic regex on the
event loop: 40 KB froze the server for 5-8 s, the store's 4 MiB would have
frozen it for hours. Now the read is linear, cached per template digest and
off the loop; a long template is read in the server's helper process, since a
thread's seconds of pure Python shared the GIL with the loop (2.3-2.7x). So
another user's ``/api/tags`` keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import json

import pytest
from harness import MAX_SLOWDOWN, Answer, slowdown

from jupyter_llm.chat_formats.detect import clear_template_cache
from jupyter_llm.models.store import MAX_TEXT_LAYER

BASELINE_RUNS = 15  # a steadier median than the harness's 5 on a busy machine
# (template, how many uncached reads in a row: enough for the attack to outlast
# the victim's samples; a 40 KB one is over in milliseconds, one read of 4 MiB of
# {##} takes seconds of a core and of <think> most of a second)
TEMPLATES = {
    "40 KB of {#": ("{#" * 20_000, 20),
    "4 MiB of {#": ("{#" * (MAX_TEXT_LAYER // 2), 2),
    "4 MiB of {##}": ("{##}" * (MAX_TEXT_LAYER // 4), 1),  # the most comments to skip
    "4 MiB of {# <think> #}<tool_call>": (
        ("{# <think> #}<tool_call>" * MAX_TEXT_LAYER)[:MAX_TEXT_LAYER],
        1,
    ),
}


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
@pytest.mark.parametrize(("template", "attacks"), TEMPLATES.values(), ids=TEMPLATES.keys())
async def test_show_on_a_hostile_template_leaves_tags_answering(
    users, installed_model, template, attacks
):
    attacker, victim = users
    assert len(template.encode()) <= MAX_TEXT_LAYER
    created = await attacker.json(
        "api/create", {"model": "hostile", "from": "tiny", "template": template, "stream": False}
    )
    assert created == (200, {"status": "success"})
    clear_template_cache()  # the attack is the first read of this template

    async def attack(running: asyncio.Event) -> Answer:
        clear_template_cache()  # a measurement taken again starts uncached too
        running.set()  # the server reads the template as soon as the request arrives
        for _ in range(attacks - 1):
            await attacker.fetch("api/show", {"model": "hostile"})
            clear_template_cache()  # each time the first read of this template
        return await attacker.fetch("api/show", {"model": "hostile"})

    victim_tags = lambda: victim.fetch("api/tags")  # noqa: E731
    measured, answer = await slowdown(victim_tags, attack, runs=BASELINE_RUNS)
    print(f"{len(template):,} characters: /api/tags {measured}")
    status, shown = answer.code, json.loads(answer.body)  # 4 MiB: after the measure
    assert status == 200, shown
    assert shown["template"] == template
    assert "completion" in shown["capabilities"]
    assert measured.ratio <= MAX_SLOWDOWN, measured
    again = await attacker.fetch("api/show", {"model": "hostile"})  # from the cache
    assert again.code == 200
    assert json.loads(again.body)["capabilities"] == shown["capabilities"]


async def test_tools_and_thinking_in_comments_do_not_count(users, installed_model):
    attacker, _ = users
    template = "{# <think> {% if tools %} #}{#" + "<tool_call>" * 100
    await attacker.json("api/create", {"model": "c", "from": "tiny", "template": template})
    status, shown = await attacker.json("api/show", {"model": "c"})
    assert status == 200, shown
    assert not {"tools", "thinking"} & set(shown["capabilities"]), shown["capabilities"]


async def test_a_template_over_the_store_limit_is_a_clear_400(users, installed_model):
    attacker, _ = users
    template = "{#" * (MAX_TEXT_LAYER // 2) + "x"
    status, answer = await attacker.json(
        "api/create", {"model": "big", "from": "tiny", "template": template, "stream": False}
    )
    assert status == 400, answer
    assert "template" in answer["error"] and f"{MAX_TEXT_LAYER:,}" in answer["error"], answer
    status, tags = await attacker.json("api/tags")
    assert status == 200 and "big:latest" not in {m["name"] for m in tags["models"]}
