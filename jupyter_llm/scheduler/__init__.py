"""The model scheduler: the state machine (``scheduler.py``), its decisions
as plain functions (``policy.py``), the fair queue, and its types. Other code
imports the public names from here."""

from jupyter_llm.scheduler.policy import choose_victim, eviction_node, max_loaded, needs_reload
from jupyter_llm.scheduler.scheduler import Scheduler
from jupyter_llm.scheduler.types import (
    Lease,
    Loaded,
    LoadOptions,
    ProgressReport,
    Runner,
    RunnerFactory,
    Wanted,
)

__all__ = [
    "Lease",
    "LoadOptions",
    "Loaded",
    "ProgressReport",
    "Runner",
    "RunnerFactory",
    "Scheduler",
    "Wanted",
    "choose_victim",
    "eviction_node",
    "max_loaded",
    "needs_reload",
]
