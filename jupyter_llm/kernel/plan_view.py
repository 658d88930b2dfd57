"""``%llm plan``'s answer: the ``/api/plan`` text of ``jupyter llm plan``, and
in a notebook the same memory bars as ``%llm devices`` (``widgets.memory_segments``
and ``bar_html``), with the planned model first and the models that stay
loaded beside it. Every string from the server is escaped."""

from __future__ import annotations

import html
from typing import Any

from jupyter_llm.connect.views import plan_text
from jupyter_llm.kernel.widgets import bar_html, memory_segments


class PlanView:
    """A display object (``text/plain`` and ``text/html``), returned so it lands in ``Out``."""

    def __init__(self, plan: dict[str, Any], loaded: list[dict[str, Any]]) -> None:
        self.plan = plan
        self.loaded = loaded  # /api/ps's models now

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": plan_text(self.plan), "text/html": plan_html(self.plan, self.loaded)}

    def __repr__(self) -> str:
        return plan_text(self.plan)


def plan_html(plan: dict[str, Any], loaded: list[dict[str, Any]]) -> str:
    """Pure: one bar per device of the layout, as it would be after the load."""
    lines = [f"<b>{html.escape(line)}</b>" for line in plan_text(plan).splitlines()[:1]]
    if plan["evicts"]:
        lines.append(f"evicts {html.escape(', '.join(plan['evicts']))}")
    name = plan["model"]
    kept = [m for m in loaded if m["name"] not in plan["evicts"] and m["name"] != name]
    for entry in plan["layout"]:
        planned = {"name": f"{name} (plan)", "allocations": [entry]}
        # free_memory is before this load (and after the evictions); a loaded
        # model reused as it is holds its bytes already
        ours = 0 if plan["loaded"] else entry["weights"] + entry["kv_cache"] + entry["graph"]
        total = entry["total_memory"]
        free = max(0, entry["free_memory"] - ours)
        segments = memory_segments(entry["device"], total, free, [planned, *kept])
        cpu = entry["library"] in ("", "CPU")
        label = "System RAM" if cpu else f"{entry['name']} · {entry['library']}"
        lines.append(
            f"<div><span>{html.escape(label)}</span> "
            f"<span style='color:#616161'>{entry['layers']} layers</span>"
            f"{bar_html(segments, total)}</div>"
        )
    return "<div>" + "<br>".join(lines) + "</div>"
