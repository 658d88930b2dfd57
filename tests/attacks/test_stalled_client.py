"""Attack: stream a long answer and read none of it, the connection left
open. The flush of the first bytes never finished, so the request held its
runner slot and the server kept the runner's replies for as long as the
model wrote (3.9 MiB/s with logprobs). Past ``STALLED_CLIENT_SECONDS`` with
nothing read the stream is closed, which cancels the generation; meanwhile
``MAX_BACKLOG`` bounds what waits (tests/runner/test_runner.py)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from endless import FOREVER
from tornado.web import RequestHandler
from waiting import until

from jupyter_llm.api import base


async def running(victim) -> int:
    """Requests running on the loaded models, as /api/ps counts them."""
    _, body = await victim.json("api/ps")
    return sum(r["running"] for m in body["models"] for r in m["priorities"].values())


async def test_a_stream_nobody_reads_is_closed_and_frees_its_slot(
    users, endless_model, monkeypatch, caplog
):
    attacker, victim = users
    monkeypatch.setattr(base, "STALLED_CLIENT_SECONDS", 0.5)
    flush = RequestHandler.flush

    def unread(self, include_footers=False):  # the socket of a client that reads nothing
        if self.request.path.endswith("api/generate") and not include_footers:
            return asyncio.get_running_loop().create_future()
        return flush(self, include_footers)

    monkeypatch.setattr(RequestHandler, "flush", unread)
    body = {"model": "endless", "prompt": "hi", "options": {"num_predict": FOREVER}}
    with caplog.at_level(logging.WARNING, logger="jupyter_llm.api.base"):
        with pytest.raises(httpx.HTTPError):  # closed before a byte went out
            await attacker.fetch("api/generate", body)
    assert "the client read nothing for 0.5 s; its stream is closed" in caplog.text
    await until_zero(victim)
    # the runner answers the next request whole
    status, answer = await victim.json(
        "api/generate", {**body, "stream": False, "options": {"num_predict": 3}}
    )
    assert status == 200 and answer["eval_count"] == 3


async def until_zero(victim) -> None:
    """Until no request runs (the cancelled one's slot freed)."""

    async def none_running() -> bool:
        return await running(victim) == 0

    await until(none_running, 30, "the cancelled request's slot to be freed", poll=0.05)
