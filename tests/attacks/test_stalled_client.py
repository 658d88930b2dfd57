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


async def test_a_whole_answer_nobody_reads_is_let_go(users, installed_model, monkeypatch, caplog):
    """A large answer (a stored response of 3 MiB of instructions) to a
    client that reads nothing: it was held whole, encoded, for as long as the
    socket stayed open (20 such GETs of a 30 MiB response held 1.5 GiB). Now
    it is encoded a chunk at a time as the client takes them, and let go
    past ``STALLED_CLIENT_SECONDS`` as a stream is."""
    attacker, _ = users
    status, made = await attacker.json(  # its own: a client's cookie names its user
        "v1/responses",
        {"model": "tiny", "input": "x", "instructions": "i" * (3 << 20), "max_output_tokens": 1},
    )
    assert status == 200, made
    monkeypatch.setattr(base, "STALLED_CLIENT_SECONDS", 0.5)
    flush = RequestHandler.flush
    flushed: list[int] = []

    def unread(self, include_footers=False):  # the socket of a client that reads nothing
        if "/v1/responses/" in self.request.path and not include_footers:
            flushed.append(len(b"".join(self._write_buffer)))
            return asyncio.get_running_loop().create_future()
        return flush(self, include_footers)

    monkeypatch.setattr(RequestHandler, "flush", unread)
    with caplog.at_level(logging.WARNING, logger="jupyter_llm.api.base"):
        with pytest.raises(httpx.HTTPError):  # closed before a byte went out
            await attacker.fetch(f"v1/responses/{made['id']}")
    assert "the client read nothing for 0.5 s" in caplog.text
    # one chunk was encoded and waited: not the whole answer
    assert len(flushed) == 1 and flushed[0] < 2 * base.FLUSH_CHARS
    monkeypatch.setattr(RequestHandler, "flush", flush)
    status, again = await attacker.json(f"v1/responses/{made['id']}")  # read, it comes whole
    assert status == 200 and again["instructions"] == "i" * (3 << 20)
