"""A loaded model's keep_alive timer: it runs while the model is idle, and
when it fires the model may be unloaded (``Scheduler`` checks that nothing
came meanwhile)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from jupyter_llm.scheduler.types import Loaded


def start_timer(loaded: Loaded, expire: Callable[[Loaded], None]) -> None:
    """Call ``expire(loaded)`` after its keep_alive (never, for forever)."""
    stop_timer(loaded)
    if math.isinf(loaded.keep_alive):
        return
    loop = asyncio.get_running_loop()
    loaded.expires_at = time.time() + loaded.keep_alive
    loaded.timer = loop.call_later(loaded.keep_alive, expire, loaded)


def stop_timer(loaded: Loaded) -> None:
    if loaded.timer is not None:
        loaded.timer.cancel()
        loaded.timer = None
    loaded.expires_at = None
