"""Gauges read from the scheduler when Prometheus scrapes, never kept in sync
by hand: queue depth, busy slots, CPU threads and memory per device and
kind of each loaded model. Reading is a walk over a few loaded models on the event loop's
thread (jupyter_server's handler calls it there): no lock, no I/O."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from jupyter_llm.scheduler import Scheduler

_schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def watch(scheduler: Scheduler) -> None:
    """Report ``scheduler``'s state at every scrape, while it lives."""
    _schedulers.add(scheduler)


class SchedulerCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = _family("queue_depth", "Requests waiting for a slot on the model", ["model"])
        busy = _family("busy_slots", "Slots running a request", ["model"])
        slots = _family("slots", "Requests the loaded model serves at once", ["model"])
        threads = _family(
            "cpu_threads", "CPU threads the model decodes with as its last request ended", ["model"]
        )
        memory = _family(
            "model_memory_bytes",
            "Memory a loaded model holds, per device and kind (weights, kv_cache, graph)",
            ["model", "device", "kind"],
        )
        pending = GaugeMetricFamily(
            "jupyter_llm_pending_requests", "Requests waiting for a load or a slot"
        )
        sums: dict[str, dict[tuple[str, ...], float]] = {}
        total = 0
        for scheduler in list(_schedulers):
            total += scheduler.pending
            for m in scheduler.loaded_models():
                _add(sums, "waiting", (m.key,), m.waiting)
                _add(sums, "busy", (m.key,), m.refcount)
                _add(sums, "slots", (m.key,), m.parallel)
                if m.runner.threads.now:  # 0: the runner did not say
                    _add(sums, "threads", (m.key,), m.runner.threads.now)
                for a in m.allocations:
                    for kind in ("weights", "kv_cache", "graph"):
                        _add(sums, "memory", (m.key, a.device, kind), getattr(a, kind))
        pending.add_metric([], total)
        for key, family in (
            ("waiting", waiting), ("busy", busy), ("slots", slots), ("threads", threads)
        ):  # fmt: skip
            for values, value in sums.get(key, {}).items():
                family.add_metric(list(values), value)
        for values, value in sums.get("memory", {}).items():
            memory.add_metric(list(values), value)
        yield from (waiting, busy, slots, threads, memory, pending)


def _family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"jupyter_llm_{name}", doc, labels=labels)


def _add(sums: dict, key: str, values: tuple[str, ...], value: float) -> None:
    table = sums.setdefault(key, {})
    table[values] = table.get(values, 0) + value


REGISTRY.register(SchedulerCollector())
