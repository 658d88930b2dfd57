"""The CPU threads a runner decodes with, as the server keeps them for
``/api/ps`` (runner_client.decode_threads): read from the load reply, moved
by each request's ``done``, never beyond what was loaded."""

from __future__ import annotations

import pytest

from jupyter_llm.runner_client.decode_threads import DecodeThreads


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"n_threads": 4, "adaptive_threads": True}, DecodeThreads(4, True, 4)),
        ({"n_threads": 2}, DecodeThreads(2, False, 2)),
        ({}, DecodeThreads(0, False, 0)),  # an older runner: not told
        ({"n_threads": "8"}, DecodeThreads(0, False, 0)),
        ({"n_threads": -1}, DecodeThreads(0, False, 0)),
        ({"n_threads": True, "adaptive_threads": 1}, DecodeThreads(0, False, 0)),  # not an int
        ({"n_threads": 10**30}, DecodeThreads(0, False, 0)),  # past num_thread's bound
    ],
)
def test_from_the_load_reply(info, expected) -> None:
    assert DecodeThreads.from_load(info) == expected


@pytest.mark.parametrize(
    ("batch", "now"),
    [
        ([{"type": "token", "text": "a"}, {"type": "done", "threads": 1}], 1),
        ([{"type": "done", "threads": 4}], 4),
        ([{"type": "done", "threads": 5}], 4),  # more than it loaded with: not believed
        ([{"type": "done", "threads": 0}], 4),  # 0: the runner did not say
        ([{"type": "done", "threads": "1"}], 4),
        ([{"type": "done", "threads": True}], 4),
        ([{"type": "token", "threads": 1}], 4),  # only a done says it
        ([{"type": "done"}], 4),
    ],
)
def test_a_done_moves_the_count(batch, now) -> None:
    threads = DecodeThreads(4, True, 4)
    threads.saw(batch)
    assert threads.now == now
    assert threads.describe() == {"now": now, "loaded": 4, "adaptive": True}


def test_a_load_that_told_no_count_believes_none() -> None:
    threads = DecodeThreads()
    threads.saw([{"type": "done", "threads": 1}])
    assert threads.describe() == {"now": 0, "loaded": 0, "adaptive": False}
