"""The helper processes: work runs in another interpreter, at the lowest
priority; what it raises comes back; a dead one is replaced."""

from __future__ import annotations

import os
import re
import signal
import sys
import types

import psutil
import pytest
from waiting import until_sync

from jupyter_llm.request import helper_process


def ended(process: psutil.Process) -> bool:
    """Exited (a zombie until the pool reaps it: waiting here would reap it first)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def helpers():
    helper_process.stop()
    yield
    helper_process.stop()


def test_work_runs_in_another_process_at_the_lowest_priority(helpers):
    assert helper_process.run(os.getpid) != os.getpid()
    assert helper_process.run(os.nice, 0) == 19
    assert helper_process.run(sorted, [3, 1, 2]) == [1, 2, 3]


def test_what_the_work_raises_is_raised_here(helpers):
    with pytest.raises(ValueError, match="invalid literal"):
        helper_process.run(int, "not a number")


async def test_limited_work_is_interrupted_by_its_cpu_time_and_the_helper_lives_on(helpers):
    assert await helper_process.run_limited(5, sorted, [2, 1]) == [1, 2]
    before = psutil.Process().children()
    # Python's re backtracks for hours on this, holding its interpreter's GIL
    with pytest.raises(helper_process.CpuLimitExceeded, match=r"over 0\.2 s of CPU"):
        await helper_process.run_limited(0.2, re.search, r"^(x+x+)+y$", "x" * 40)
    assert all(helper.is_running() for helper in before)
    assert await helper_process.run_limited(5, sorted, [2, 1]) == [1, 2]  # the timer was reset


def test_a_helper_that_died_is_replaced(helpers):
    pid = helper_process.run(os.getpid)
    helper = psutil.Process(pid)
    assert helper.ppid() == os.getpid()  # our child: its pid is not reused until we reap it
    os.kill(pid, signal.SIGKILL)
    until_sync(lambda: ended(helper), what="the killed helper's exit")
    assert helper_process.run(os.getpid) not in (pid, os.getpid())


def test_stop_ends_the_helpers(helpers):
    helper = psutil.Process(helper_process.run(os.getpid))
    helper_process.stop()
    assert ended(helper)  # stop waits for its helpers
    assert helper_process.run(os.getpid) != helper.pid  # a new one on the next use


def test_a_main_without_a_spec_still_spawns(helpers, monkeypatch):
    """IPython's shell (and a pytest-xdist worker) swap ``__main__`` for a
    namespace without ``__spec__``, which spawning a process reads."""
    namespace = types.ModuleType("__main__")
    del namespace.__spec__, namespace.__name__
    monkeypatch.setitem(sys.modules, "__main__", namespace)
    assert helper_process.run(os.getpid) != os.getpid()
