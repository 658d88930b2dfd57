"""``GET {base_url}llm/api/history``: the sidebar's history, kept by the
server's sampler (``jupyter_llm.history``), so a browser reload shows the
last ten minutes at once. ``?points=N`` merges the samples into at most N
points for a small chart (``history_points``)."""

from __future__ import annotations

import re

from tornado import web

from jupyter_llm.api.base import LLM, LLMHandler, authorized
from jupyter_llm.history import history_body
from jupyter_llm.history.ring import HistoryRing
from jupyter_llm.history.sampler import INTERVAL
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.limits import HISTORY_POINTS


def points_argument(raw: str | None) -> int:
    """``points`` as a whole number from 1 to ``history_points`` (absent: all of them)."""
    if raw is None:
        return HISTORY_POINTS.value
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        raise InvalidRequest(f"points must be a whole number from 1 to {HISTORY_POINTS.value:,}")
    try:
        HISTORY_POINTS.check("points", int(raw))
    except ValueError as e:
        raise InvalidRequest(str(e)) from e
    return int(raw)


class HistoryHandler(LLMHandler):
    """Reads like ``/api/ps`` (``read`` on ``llm``)."""

    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        points = points_argument(self.get_query_argument("points", None))
        sampler = self.llm.history
        if sampler is None:  # services without a sampler (a test's): an empty history
            self.write_json(history_body(HistoryRing(), points, INTERVAL, running=False))
            return
        self.write_json(history_body(sampler.ring, points, sampler.interval, sampler.running))

    head = get  # a probe: the same status and headers, no body


def handlers() -> list[tuple[str, type]]:
    return [("api/history", HistoryHandler)]
