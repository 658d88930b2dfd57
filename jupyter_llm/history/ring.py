"""Pure parts of the history: one sample, the caps on what it holds, the ring
of the last ten minutes and downsampling for a small chart. No I/O, no
clock: the sampler feeds it, the route reads it, tables test it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from jupyter_llm.request.limits import HISTORY_DEVICES, HISTORY_MODELS, HISTORY_SAMPLES

OTHER = "other"  # the models past the cap, summed


@dataclass(frozen=True)
class Sample:
    """What the devices held and how fast tokens came, at one moment."""

    t: float  # unix seconds
    memory: dict[str, dict[str, int]]  # device id -> model -> bytes
    utilization: dict[str, float] = field(default_factory=dict)  # device id -> percent
    tokens_per_second: dict[str, float] = field(default_factory=dict)  # model -> tokens/s

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "memory": self.memory,
            "utilization": self.utilization,
            "tokens_per_second": self.tokens_per_second,
        }


def top_models(values: dict[str, Any], cap: int = HISTORY_MODELS.value) -> dict[str, Any]:
    """At most ``cap`` entries: the largest ``cap - 1`` and the rest summed as
    ``other``, so a point stays small however many models come and go."""
    if len(values) <= cap:
        return dict(values)
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[: cap - 1])
    kept[OTHER] = kept.get(OTHER, 0) + sum(v for _, v in ranked[cap - 1 :])
    return kept


def bounded(sample: Sample) -> Sample:
    """``sample`` within the caps: devices (those holding most first) and models per device."""
    devices = sorted(sample.memory, key=lambda d: (-sum(sample.memory[d].values()), d))
    kept = devices[: HISTORY_DEVICES.value]
    return Sample(
        t=sample.t,
        memory={d: top_models(sample.memory[d]) for d in kept},
        # the kept devices' (a device without memory figures is not charted)
        utilization={d: u for d, u in sample.utilization.items() if d in kept},
        tokens_per_second=top_models(sample.tokens_per_second),
    )


class HistoryRing:
    """The last ``size`` samples; the oldest drops out as a new one comes."""

    def __init__(self, size: int = HISTORY_SAMPLES.value) -> None:
        self._samples: deque[Sample] = deque(maxlen=size)
        self.devices: list[dict[str, Any]] = []  # the latest device list: id, name, totals

    def add(self, sample: Sample) -> Sample:
        """Keep ``sample`` within the caps; the sample as kept."""
        kept = bounded(sample)
        self._samples.append(kept)
        return kept

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


def _mean_of_maps(maps: Sequence[dict[str, float]], count: int) -> dict[str, float]:
    """Per key, the sum over ``maps`` divided by ``count`` (a missing key is 0)."""
    sums: dict[str, float] = {}
    for m in maps:
        for k, v in m.items():
            sums[k] = sums.get(k, 0) + v
    return {k: v / count for k, v in sums.items()}


def merge(bucket: Sequence[Sample]) -> Sample:
    """One sample for consecutive ``bucket``: its last time, mean memory and
    tokens/s (a model absent from a sample held 0 then), and mean
    utilization over the samples that report it."""
    n = len(bucket)
    devices = list(dict.fromkeys(d for s in bucket for d in s.memory))
    memory = {}
    for d in devices:
        means = _mean_of_maps([s.memory.get(d, {}) for s in bucket], n)
        memory[d] = {m: round(v) for m, v in means.items()}
    utilization = {}
    for d in dict.fromkeys(d for s in bucket for d in s.utilization):
        seen = [s.utilization[d] for s in bucket if d in s.utilization]
        utilization[d] = round(sum(seen) / len(seen), 1)
    rates = _mean_of_maps([s.tokens_per_second for s in bucket], n)
    return Sample(
        t=bucket[-1].t,
        memory=memory,
        utilization=utilization,
        tokens_per_second={m: round(v, 2) for m, v in rates.items()},
    )


def downsample(samples: Sequence[Sample], points: int) -> list[Sample]:
    """At most ``points`` samples: consecutive runs merged (``merge``), the
    newest sample always ending the last run. Fewer samples pass unchanged."""
    if points <= 0:
        return []
    if len(samples) <= points:
        return list(samples)
    n = len(samples)
    edges = [n - (points - i) * n // points for i in range(points + 1)]
    return [merge(samples[a:b]) for a, b in pairwise(edges) if b > a]


def history_body(ring: HistoryRing, points: int, interval: float, running: bool) -> dict[str, Any]:
    """The ``/api/history`` body: the window, the devices and the samples, oldest first."""
    samples: Iterable[Sample] = downsample(ring.samples(), points)
    return {
        "interval": interval,
        "window": round(interval * HISTORY_SAMPLES.value),
        "sampling": running,
        "devices": ring.devices,
        "samples": [s.to_json() for s in samples],
    }
