"""What the attack suite shares (its conftest re-exports the fixtures):
another user's request timed against its own baseline while an attack runs,
and a runner's memory before and after.

Nothing here compares against a fixed time: the victim is measured alone
first, then while the attack is observed running, in the same test, and the
ratio is what a test asserts. Runner memory is RSS from /proc (psutil)."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest

MAX_SLOWDOWN = 2.0  # the bound: another user's request at most 2x its baseline
MAX_RSS_GROWTH = 100 << 20  # and a runner grows by less than 100 MiB per attack
BASELINE_RUNS = 15
MAX_DURING = 500  # victim runs while one attack lasts (it is timed until the attack ends)
MIN_DURING = 5
TRIES = 3  # measurements of one attack before its slowdown counts as real


# What each test measured, for the table benchmarks/attacks.py prints.
MEASURED: list[tuple[str, str]] = []
current_test = ""  # set by the conftest for each test


def record(text: str) -> None:
    MEASURED.append((current_test, text))


@dataclass
class Slowdown:
    """A victim's median time alone and while an attack ran."""

    baseline: float
    during: float
    samples: int

    @property
    def ratio(self) -> float:
        """``during`` over ``baseline``, the baseline taken as at least one
        GIL switch interval: a worker thread busy in Python (reading a
        template, encoding JSON) holds the GIL, and CPython hands it back to
        the event loop only after up to that long, so a 2 ms request can take
        7 ms beside one. That is CPython's scheduling, not the server
        freezing; the freezes these tests guard against were seconds long."""
        return self.during / max(self.baseline, sys.getswitchinterval())

    def __str__(self) -> str:
        return (
            f"{self.during * 1000:.1f} ms during the attack against {self.baseline * 1000:.1f} ms "
            f"alone ({self.ratio:.2f}x, {self.samples} samples)"
        )


async def timed(request: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await request()
    return time.perf_counter() - start


async def slowdown(
    victim: Callable[[], Awaitable[Any]],
    attack: Callable[[asyncio.Event], Awaitable[Any]],
    *,
    runs: int = BASELINE_RUNS,
    tries: int = TRIES,
) -> tuple[Slowdown, Any]:
    """Time ``victim`` alone, then while ``attack`` runs: ``attack`` sets the
    event it is given once it is observed running (its first chunk, a 400),
    and the victim is timed from then until the attack ends (at least
    ``MIN_DURING``, at most ``MAX_DURING`` times). Returns the medians and
    the attack's result.

    On a small shared machine one measurement can be off by more than the
    bound for reasons of its own (another process on both cores), so a pair
    over ``MAX_SLOWDOWN`` is taken again, up to ``tries`` times, and the best
    is returned: a real freeze (seconds, hundreds of times the baseline)
    shows in every try."""
    best: tuple[Slowdown, Any] | None = None
    for _ in range(tries):
        measured, result = await _slowdown_once(victim, attack, runs)
        if best is None or measured.ratio < best[0].ratio:
            best = measured, result
        if measured.ratio <= MAX_SLOWDOWN:
            break
    assert best is not None
    return best


async def _slowdown_once(
    victim: Callable[[], Awaitable[Any]],
    attack: Callable[[asyncio.Event], Awaitable[Any]],
    runs: int,
) -> tuple[Slowdown, Any]:
    await victim()  # warm: a first request may load a model
    baseline = statistics.median([await timed(victim) for _ in range(runs)])
    running = asyncio.Event()
    task = asyncio.ensure_future(attack(running))
    waiter = asyncio.ensure_future(running.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    during: list[float] = []
    while len(during) < MAX_DURING and (len(during) < MIN_DURING or not task.done()):
        during.append(await timed(victim))
    result = await task
    measured = Slowdown(baseline, statistics.median(during), len(during))
    record(f"victim {measured}")
    return measured, result


def runner_pids(serverapp: Any) -> list[int]:
    """The pids of the runners the server's scheduler holds now."""
    scheduler = serverapp.web_app.settings["jupyter_llm"].scheduler
    return [m.runner.pid for m in scheduler.loaded_models() if m.runner.pid]


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def rss_growth(pid: int, before: int) -> int:
    """How much runner ``pid`` grew since ``before`` (recorded for the table)."""
    grown = rss(pid) - before
    record(f"runner RSS {before / 2**20:.0f} MiB -> {(before + grown) / 2**20:.0f} MiB")
    return grown


@dataclass
class Answer:
    code: int
    body: bytes


class Client:
    """One user's requests to the in-process server, answering status and JSON
    (or the lines of a stream) whatever the status.

    The requests are sent from this client's own threads (httpx), never from
    the server's event loop: an attacker's upload or download must not cost
    the loop more than it would from another machine."""

    def __init__(self, port: int, base_url: str, token: str) -> None:
        self.base = f"http://127.0.0.1:{port}{base_url}llm/"
        self.http = httpx.Client(
            headers={"Authorization": f"token {token}"}, timeout=httpx.Timeout(600.0)
        )
        self.threads = ThreadPoolExecutor(8, thread_name_prefix="attack-client")

    async def fetch(
        self,
        path: str,
        body: Any = None,
        streaming_callback: Callable[[bytes], None] | None = None,
        method: str | None = None,
    ) -> Answer:
        """``body``: None for a GET, bytes as they are, anything else as JSON;
        ``streaming_callback`` gets each chunk on the caller's loop as it comes."""
        loop = asyncio.get_running_loop()
        method = method or ("GET" if body is None else "POST")
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body)

        def chunk(part: bytes) -> None:
            if streaming_callback is not None:
                loop.call_soon_threadsafe(streaming_callback, part)

        def send() -> Answer:
            with self.http.stream(method, self.base + path, content=data) as r:
                parts = []
                for part in r.iter_raw():
                    parts.append(part)
                    chunk(part)
                return Answer(r.status_code, b"".join(parts))

        return await loop.run_in_executor(self.threads, send)

    async def json(self, path: str, body: Any = None) -> tuple[int, Any]:
        r = await self.fetch(path, body)
        text = r.body.decode()
        try:
            return r.code, json.loads(text)
        except json.JSONDecodeError:
            return r.code, [json.loads(line) for line in text.splitlines() if line.strip()]

    async def stream(
        self, path: str, body: Any, started: asyncio.Event | None = None
    ) -> tuple[int, list[Any]]:
        """A streamed request's lines (NDJSON or SSE); ``started`` is set at
        its first chunk."""

        def chunk(data: bytes) -> None:
            if started is not None:
                started.set()

        r = await self.fetch(path, body, streaming_callback=chunk)
        text = r.body.decode()
        lines = [line.removeprefix("data: ") for line in text.splitlines() if line.strip()]
        return r.code, [json.loads(line) for line in lines if line != "[DONE]"]

    def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)
        self.http.close()


@pytest.fixture
def users(jp_serverapp, jp_base_url, http_server, http_server_port):
    """Two clients of the one server: ``(attacker, victim)``."""
    token = jp_serverapp.identity_provider.token
    pair = (
        Client(http_server_port[1], jp_base_url, token),
        Client(http_server_port[1], jp_base_url, token),
    )
    yield pair
    for client in pair:
        client.close()


def tiny_generate(**extra: Any) -> dict[str, Any]:
    """Another user's 10-token answer from the demo model."""
    return {
        "model": "tiny",
        "prompt": "hello",
        "stream": False,
        "options": {"num_predict": 10, "temperature": 0, **extra},
    }
