"""A process whose event loop stopped while a task that used
``anyio.to_thread`` was still waiting (a request in flight when the Jupyter
server stops) exits once ``server_exit`` is installed; the same process
without it keeps a non-daemon AnyIO worker that its exit would join."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from jupyter_llm import server_exit

STOPPED_MID_REQUEST = textwrap.dedent(
    """
    import asyncio, sys, threading
    import anyio.to_thread
    from anyio._backends._asyncio import WorkerThread
    from jupyter_llm import server_exit

    if sys.argv[1] == "installed":
        server_exit.install()
    loop = asyncio.new_event_loop()

    async def request():  # reads a file in AnyIO's worker, then waits on a client
        await anyio.to_thread.run_sync(len, "a file")
        loop.stop()  # the server stops while it waits
        await asyncio.Event().wait()

    loop.create_task(request())
    loop.run_forever()  # as tornado runs the server's loop
    workers = [t for t in threading.enumerate() if isinstance(t, WorkerThread)]
    print("waiting workers:", sum(t.is_alive() and not t.daemon for t in workers), flush=True)
    """
)


def run(mode: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", STOPPED_MID_REQUEST, mode],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_process_exits_past_a_waiting_anyio_worker() -> None:
    done = run("installed", timeout=120)  # a hang at exit raises TimeoutExpired
    assert done.returncode == 0, done.stderr
    assert "waiting workers: 1" in done.stdout  # the case that hangs was there


def test_without_it_a_waiting_worker_outlives_the_loop() -> None:
    """The control: that worker is still waiting when the main thread ends
    (its exit would join it forever, so the process is killed here)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STOPPED_MID_REQUEST, "bare"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting workers: 1"
    finally:
        proc.kill()  # our own child, waited for below: the signal cannot outlive it
        proc.wait()


@pytest.fixture
def registered(monkeypatch) -> list[object]:
    """What registers at exit from here on (the extension may have done so
    already in this process: it is made to do it again, seen)."""
    seen: list[object] = []
    monkeypatch.setattr(server_exit, "_installed", False)
    monkeypatch.setattr(threading, "_register_atexit", seen.append)
    return seen


def test_the_server_extension_installs_it(registered, jp_serverapp) -> None:
    assert jp_serverapp.extension_manager.extensions["jupyter_llm"].enabled
    assert registered.count(server_exit.stop_anyio_workers) == 1
