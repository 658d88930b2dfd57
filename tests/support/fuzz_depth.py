"""How many examples a fuzz test runs: a count sized for ``make test`` by
default, and the full count with ``JUPYTER_LLM_DEEP_FUZZ=1`` (CONTRIBUTING.md)
before a release or after a change to what the fuzz covers."""

from __future__ import annotations

import os

DEEP = os.environ.get("JUPYTER_LLM_DEEP_FUZZ", "") not in ("", "0")


def examples(default: int, deep: int) -> int:
    """``deep`` when the deep run is asked for, else ``default``."""
    return deep if DEEP else default


# pytest's timeout (pyproject: 120 s) for a fuzz test: the deep counts take
# minutes on a loaded two-core machine
TIMEOUT = 600 if DEEP else 120
