"""Attack: send requests and close their connections while they wait for a
slot. They kept their places in the queue (and later ran their prompts for
no one): forty sent and dropped at once still showed 40 queued, and all ran.
A request whose client leaves while it waits is withdrawn at once."""

from __future__ import annotations

import json

import pytest
from endless import FOREVER
from raw_http import open_post
from waiting import until


@pytest.fixture
def llm_config() -> dict:
    return {"num_parallel": 1, "num_threads": 1}


async def counts(jp_fetch) -> tuple[int, int]:
    """(running, queued) on the loaded models, as /api/ps counts them."""
    models = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    states = [s for m in models for s in m["priorities"].values()]
    return sum(s["running"] for s in states), sum(s["queued"] for s in states)


async def until_counts(jp_fetch, expected: tuple[int, int]) -> None:
    async def seen() -> bool:
        return await counts(jp_fetch) == expected

    await until(seen, 60, f"(running, queued) to be {expected}", poll=0.05)


async def test_requests_whose_clients_left_while_queued_are_withdrawn(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, endless_model
):
    port, token = http_server_port[1], jp_serverapp.identity_provider.token
    long = {"model": "endless", "prompt": "hi", "options": {"num_predict": FOREVER}}
    holder = await open_post(port, jp_base_url, token, "api/generate", long)  # takes the one slot
    await until_counts(jp_fetch, (1, 0))
    left = [await open_post(port, jp_base_url, token, "api/generate", long) for _ in range(5)]
    await until_counts(jp_fetch, (1, 5))
    for _, writer in left:
        writer.close()
    await until_counts(jp_fetch, (1, 0))  # withdrawn, not run later
    holder[1].close()  # the stream's client leaves: its generation ends
    await until_counts(jp_fetch, (0, 0))
