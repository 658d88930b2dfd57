"""The usage table the server keeps in memory: per user (and model), and
per kernel, cell and model. Bounded: kernels and their cells are LRUs
(``USAGE_KERNELS``, ``USAGE_CELLS``), users too (``USAGE_USERS``), and a
cell or user counts at most ``USAGE_MODELS`` models apart. One user keeps at
most ``USAGE_USER_KERNELS`` kernels, their own oldest dropped first: anyone
may name a new kernel in a header, and that must not push out other users'
rows. Only the event
loop touches it (records at a request's end, reads by ``/api/usage``), so
it takes no lock. A restart forgets it."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from jupyter_llm.request.limits import (
    USAGE_CELLS,
    USAGE_KERNELS,
    USAGE_MODELS,
    USAGE_ROWS,
    USAGE_USER_KERNELS,
    USAGE_USERS,
)
from jupyter_llm.request.origin import Origin, cell_key
from jupyter_llm.usage.accounting import Sample, Totals, added, figures

ByModel = OrderedDict[str, Totals]


@dataclass(slots=True)
class CellUsage:
    execution_count: int | None
    models: ByModel = field(default_factory=OrderedDict)
    last: float = 0.0  # wall-clock time of its last request


def _touch(table: OrderedDict, key: Any, make: Any, bound: int) -> Any:
    """``table[key]`` (made by ``make()`` if missing), now the most recent;
    the least recent entries dropped past ``bound``."""
    if key in table:
        table.move_to_end(key)
        return table[key]
    value = table[key] = make()
    while len(table) > bound:
        table.popitem(last=False)
    return value


def _count(models: ByModel, sample: Sample, bound: int) -> None:
    totals = _touch(models, sample.model, Totals, bound)
    models[sample.model] = added(totals, sample)


class UsageStore:
    def __init__(
        self,
        kernels: int = USAGE_KERNELS.value,
        cells: int = USAGE_CELLS.value,
        users: int = USAGE_USERS.value,
        models: int = USAGE_MODELS.value,
        user_kernels: int = USAGE_USER_KERNELS.value,
    ) -> None:
        self.bounds = (kernels, cells, users, models)
        self.user_kernels = user_kernels
        self._users: OrderedDict[str, ByModel] = OrderedDict()
        self._kernels: OrderedDict[tuple[str, str], OrderedDict[str, CellUsage]] = OrderedDict()

    def record(self, user: str, origin: Origin, sample: Sample, now: float | None = None) -> None:
        """Count one request that ended, in its user's and its cell's rows."""
        kernels, cells, users, models = self.bounds
        _count(_touch(self._users, user, OrderedDict, users), sample, models)
        self._make_room(user, origin.kernel)
        cell_table = _touch(self._kernels, (user, origin.kernel), OrderedDict, kernels)
        cell = _touch(cell_table, cell_key(origin), lambda: CellUsage(None), cells)
        if origin.execution_count is not None:
            cell.execution_count = origin.execution_count
        cell.last = time.time() if now is None else now
        _count(cell.models, sample, models)

    def _make_room(self, user: str, kernel: str) -> None:
        """Before ``user`` gets a new kernel: their least recently active one
        dropped if they hold ``user_kernels`` already."""
        if (user, kernel) in self._kernels:
            return
        mine = [key for key in self._kernels if key[0] == user]
        for key in mine[: max(0, len(mine) - self.user_kernels + 1)]:
            del self._kernels[key]

    def user_rows(self, user: str | None = None) -> list[dict[str, Any]]:
        """Per user and model (one user's, or everyone's with None), the most
        recently active users first; at most ``USAGE_ROWS`` (an admin's answer
        on a Hub of a thousand users would otherwise be 8,000 rows, 2 MiB)."""
        names = [user] if user is not None else reversed(self._users)
        rows = (
            {"user": name, "model": model, **figures(totals)}
            for name in names
            for model, totals in self._users.get(name, {}).items()
        )
        return list(islice(rows, USAGE_ROWS.value))

    def cell_rows(self, user: str | None = None, kernel: str | None = None) -> list[dict[str, Any]]:
        """Per kernel, cell and model, the most recently active kernels first
        and each kernel's cells in the order they ran; at most ``USAGE_ROWS``."""
        rows: list[dict[str, Any]] = []
        for (owner, kid), cells in self._recent_kernels():
            if (user is not None and owner != user) or (kernel is not None and kid != kernel):
                continue
            for key, cell in sorted(cells.items(), key=lambda item: item[1].last):
                for model, totals in cell.models.items():
                    if len(rows) >= USAGE_ROWS.value:
                        return rows
                    rows.append(
                        {"user": owner, "kernel": kid, "cell": key,
                         "execution_count": cell.execution_count, "model": model,
                         **figures(totals)}
                    )  # fmt: skip
        return rows

    def _recent_kernels(self) -> Iterator[tuple[tuple[str, str], OrderedDict[str, CellUsage]]]:
        yield from reversed(self._kernels.items())

    def sizes(self) -> tuple[int, int, int]:
        """(users, kernels, cells) held now: what the bounds keep small."""
        return len(self._users), len(self._kernels), sum(map(len, self._kernels.values()))
