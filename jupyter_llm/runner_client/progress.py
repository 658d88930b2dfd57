"""How far a model load has got, from the runner's load to whoever started it.

The scheduler starts a runner through an injected factory whose signature
stays one argument; it sets ``reporting_load_progress`` around that call, and
``RunnerProxy.load`` (running in the same task) calls ``report_load_progress``
with each fraction the runner sends. Fake runners report nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_REPORT: ContextVar[Callable[[float], None] | None] = ContextVar(
    "jupyter_llm_load_progress", default=None
)


@contextlib.contextmanager
def reporting_load_progress(report: Callable[[float], None]) -> Iterator[None]:
    """Within this block (this task), load progress goes to ``report``."""
    token = _REPORT.set(report)
    try:
        yield
    finally:
        _REPORT.reset(token)


def report_load_progress(fraction: float) -> None:
    if (report := _REPORT.get()) is not None:
        report(min(1.0, max(0.0, fraction)))
