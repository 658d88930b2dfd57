"""The one way tests wait: for an observed condition, with a deadline and a
message naming what was awaited, never a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import pytest


async def until(
    condition: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "the condition",
    poll: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """``condition()``'s first true value (awaited when it is a coroutine);
    fails the test after ``timeout`` seconds. Exceptions in ``ignore`` count
    as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except ignore:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(poll)


def until_sync(
    condition: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "the condition",
    poll: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """``until`` for code outside an event loop (threads, subprocesses, a browser)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if value := condition():
                return value
        except ignore:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def iopub_until(kc, msg_id: str, match, timeout: float, what: str) -> dict:
    """The first message of cell ``msg_id`` that ``match``es; fails at the
    deadline, on an error, or when the cell ends without one."""
    import queue
    import time

    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = kc.get_iopub_msg(timeout=left)
        except queue.Empty:
            break
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if match(msg):
            return msg
        if msg["msg_type"] == "error":
            pytest.fail(f"the cell failed while waiting for {what}: {msg['content']}")
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            pytest.fail(f"the cell ended before {what}")
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
