"""Accounting per user, kernel, cell and model (``%llm usage``, ``GET /api/usage``)."""

from jupyter_llm.usage.accounting import Sample, Totals, added, device_seconds, figures
from jupyter_llm.usage.store import UsageStore

__all__ = ["Sample", "Totals", "UsageStore", "added", "device_seconds", "figures"]
