"""A cap on the distinct label sets each metric may grow to.

Models are bounded by the store and users by the Hub, but a metric's series
live as long as the process: past ``METRIC_LABEL_SETS`` distinct sets, a new
one is counted under ``other`` (its model and user), so a scrape stays small
whatever the server has seen."""

from __future__ import annotations

import threading

from jupyter_llm.request.limits import METRIC_LABEL_SETS

OTHER = "other"


class LabelCap:
    """The label sets one metric has used; new ones past the cap become ``other``."""

    def __init__(self, cap: int = METRIC_LABEL_SETS.value) -> None:
        self.cap = cap
        self._seen: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def bound(self, values: tuple[str, ...], open_at: tuple[int, ...]) -> tuple[str, ...]:
        """``values`` as given if seen or under the cap; else with the
        positions ``open_at`` (the unbounded ones: model, user) as ``other``."""
        with self._lock:
            if values in self._seen:
                return values
            if len(self._seen) < self.cap - 1:  # one set is kept for "other"
                self._seen.add(values)
                return values
        return tuple(OTHER if i in open_at else v for i, v in enumerate(values))
