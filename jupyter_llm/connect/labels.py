"""How single values from the API read to a person: sizes, ages, and the
PROCESSOR label. One rule for ``jupyter llm``, the ``%llm`` commands, the
notebook's ``DeviceDashboard`` and (in TypeScript, ``labextension/src/format.ts``)
the JupyterLab sidebar."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def processor_label(model: dict[str, Any]) -> str:
    """Ollama's PROCESSOR column for an ``/api/ps`` entry: how the model is
    split between CPU and GPU. Every layer on a GPU reads as 100% GPU though
    system RAM still holds buffers (token embeddings, the host's compute buffer,
    logits); otherwise the memory split, where a side that rounds to 0% reads
    as 100% on the other."""
    size, vram = model.get("size") or 0, model.get("size_vram") or 0
    if not size or vram == 0:
        return "100% CPU"
    layers, on_gpu = model.get("num_layers") or 0, model.get("num_gpu_layers") or 0
    if layers and on_gpu >= layers:
        return "100% GPU"
    gpu = round(100 * vram / size)
    if gpu >= 100:
        return "100% GPU"
    if gpu <= 0:
        return "100% CPU"
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


def threads_label(model: dict[str, Any]) -> str:
    """The CPU threads of an ``/api/ps`` entry with layers on the CPU, as its
    last request ended: "2 threads", or "1 of 2 threads" when other work held
    cores then (``threads``: ``now``, ``loaded``). "" for a model wholly on
    GPUs, or where the server does not say. The sidebar's ``threadsText``."""
    threads = model.get("threads")
    if not isinstance(threads, dict) or processor_label(model) == "100% GPU":
        return ""
    loaded, now = threads.get("loaded"), threads.get("now")
    if type(loaded) is not int or loaded < 1:
        return ""
    unit = "thread" if loaded == 1 else "threads"
    if type(now) is int and 1 <= now < loaded:
        return f"{now} of {loaded} {unit}"
    return f"{loaded} {unit}"


def human_size(n: float) -> str:
    """Decimal units, as Ollama's ``list`` shows them."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def ago(iso: str, now: datetime | None = None) -> str:
    """An ISO timestamp as "3 days ago"; text that is not one is shown as is."""
    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    span = _span(((now or datetime.now(UTC)) - then).total_seconds())
    return f"{span} ago" if span else "just now"


def until(iso: str, now: datetime | None = None) -> str:
    """An ``expires_at`` as Ollama's ``ps`` UNTIL column: "4 minutes from now",
    "Forever" for a model kept loaded, "Stopping..." once it has passed; text
    that is not a timestamp is shown as is."""
    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    seconds = (then - (now or datetime.now(UTC))).total_seconds()
    if seconds <= 0:
        return "Stopping..."
    if seconds > 100 * 365 * 86400:
        return "Forever"
    return f"{_span(seconds) or 'less than a minute'} from now"


def _span(seconds: float) -> str:
    """Whole days, hours or minutes ("3 days", "1 minute"); "" under a minute."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''}"
    return ""
