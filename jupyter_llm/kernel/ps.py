"""How an ``/api/ps`` entry reads to a person: one rule for ``jupyter llm ps``,
the notebook's ``DeviceDashboard`` and (in TypeScript) the JupyterLab sidebar."""

from __future__ import annotations

from typing import Any


def processor(model: dict[str, Any]) -> str:
    """Ollama's PROCESSOR column: how the model is split between CPU and GPU.
    A split that rounds to 0% on one side reads as 100% on the other (a fully
    offloaded model keeps its token embeddings in system RAM)."""
    size, vram = model.get("size") or 0, model.get("size_vram") or 0
    if not size or vram == 0:
        return "100% CPU"
    gpu = round(100 * vram / size)
    if gpu >= 100:
        return "100% GPU"
    if gpu <= 0:
        return "100% CPU"
    return f"{100 - gpu}%/{gpu}% CPU/GPU"
