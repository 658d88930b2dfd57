"""The ``/api/ps`` body: each loaded model with Ollama's fields plus where each
byte lives, how many requests it serves at once (``parallel``) and its
requests by priority (``priorities``: running and queued, interactive and
batch) and one by one (``requests``: state, user, priority, since; at most
``limits.PS_REQUESTS``, ``requests_left_out`` counting the rest), its
speculative decoding's draft tokens so far (``speculative``: drafted and
accepted), and the models being loaded with their progress (``loading``). Our
additions are read by the sidebar, ``jupyter llm`` and the kernel; Ollama's clients ignore them."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from jupyter_llm.devices import on_node
from jupyter_llm.memory import CPU
from jupyter_llm.metrics.instruments import drafts_so_far
from jupyter_llm.request.limits import PS_REQUESTS
from jupyter_llm.request.priority import PRIORITIES
from jupyter_llm.scheduler import Loaded, Scheduler
from jupyter_llm.scheduler.types import Request

FOREVER_ISO = "2318-01-01T00:00:00Z"  # what Ollama reports for keep_alive < 0


def ps_body(scheduler: Scheduler) -> dict[str, Any]:
    models = []
    for m in scheduler.loaded_models():
        model = describe_loaded(m, holders(m, scheduler.queued(m)))
        model["priorities"] = by_priority(m, scheduler.queued_by_priority(m))
        model.update(listed(scheduler.requests(m)))
        model["speculative"] = drafts_so_far(m.entry.name.display)  # draft tokens so far
        models.append(model)
    return {"models": models, "loading": describe_loading(scheduler.loading_models())}


def by_priority(loaded: Loaded, queued: dict[str, dict[str, int]]) -> dict[str, Any]:
    """``{"interactive": {"running", "queued"}, "batch": {...}}``: the model's
    requests by priority (``queued``: per user, waiting requests by priority)."""
    return {
        p: {
            "running": max(0, loaded.by_priority.get(p, 0)),
            "queued": sum(mine.get(p, 0) for mine in queued.values()),
        }
        for p in PRIORITIES
    }


def listed(requests: list[Request], cap: int = PS_REQUESTS.value) -> dict[str, Any]:
    """``{"requests": [{"user", "priority", "state", "since"}]}``: the first
    ``cap`` of them, and ``requests_left_out`` with the count of the rest
    where there are more. Users are named as in ``users``; no prompt text."""
    body: dict[str, Any] = {
        "requests": [
            {"user": r.user, "priority": r.priority, "state": r.state, "since": _iso(r.since)}
            for r in requests[:cap]
        ]
    }
    if len(requests) > cap:
        body["requests_left_out"] = len(requests) - cap
    return body


def describe_loading(loading: dict[str, float]) -> list[dict[str, Any]]:
    """``[{"name", "model", "progress"}]``: progress is the fraction loaded, 0..1."""
    return [
        {"name": name, "model": name, "progress": round(progress, 4)}
        for name, progress in sorted(loading.items())
    ]


def holders(loaded: Loaded, queued: dict[str, int]) -> list[dict[str, Any]]:
    """Who holds ``loaded``: each user with requests running or queued
    (``queued``: waiting requests per user) on it."""
    names = sorted({*(u for u, n in loaded.users.items() if n), *queued})
    return [
        {"name": u, "running": loaded.users.get(u, 0), "queued": queued.get(u, 0)} for u in names
    ]


def describe_loaded(loaded: Loaded, users: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``users``: who holds it (``holders``: name, running, queued)."""
    entry = loaded.entry
    expires = loaded.expires_at
    if expires is None and not math.isinf(loaded.keep_alive):
        expires = time.time() + loaded.keep_alive
    total = sum(a.total for a in loaded.allocations)
    vram = sum(a.total for a in loaded.allocations if a.device != CPU)
    return {
        "name": entry.name.display,
        "model": entry.name.display,
        "size": total,
        "size_vram": vram,
        "digest": entry.digest,
        "details": entry.details,
        "expires_at": _iso(expires) if expires is not None else FOREVER_ISO,
        "context_length": loaded.wanted.num_ctx,
        "kv_cache_type": loaded.wanted.kv_cache_type,  # the type used (f16 on a fallback)
        "kv_cache_fallback": loaded.wanted.kv_cache_fallback,  # why, "" when none
        "batch_invariant": loaded.wanted.batch_invariant,  # logits independent of batching
        "batch_invariant_fallback": loaded.wanted.batch_invariant_fallback,  # why not
        "num_gpu_layers": loaded.placement.n_gpu_layers,
        "num_layers": loaded.placement.n_layers,
        "pid": loaded.runner.pid,
        "threads": loaded.runner.threads.describe(),  # CPU threads: now, as loaded, tuned
        "parallel": loaded.parallel,
        "users": users or [],
        "vision": entry.vision,
        "node": loaded.node,  # the cluster node it runs on ("": this machine)
        "allocations": [
            {"device": on_node(loaded.node, a.device), "weights": a.weights, "kv_cache": a.kv_cache,
             "graph": a.graph, "measured": loaded.measured,
             "layers": loaded.placement.layers_on(a.device)}
            for a in loaded.allocations
        ],
    }  # fmt: skip


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
