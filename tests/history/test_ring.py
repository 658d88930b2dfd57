"""The history's pure parts, as tables: the model cap, merging and
downsampling, the ring's bound, token rates, memory by model, and the
utilization figures (simulated, and NVML's matched to our device ids)."""

from __future__ import annotations

import json
from itertools import pairwise
from types import SimpleNamespace

import pytest

from jupyter_llm.devices import DeviceInfo
from jupyter_llm.devices.nvml import utilization_of
from jupyter_llm.devices.simulated import parse_simulated_utilization
from jupyter_llm.history.ring import (
    OTHER,
    HistoryRing,
    Sample,
    bounded,
    downsample,
    history_body,
    merge,
    top_models,
)
from jupyter_llm.history.sampler import memory_by_model
from jupyter_llm.history.tokens import TokenTally, rates
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.request.limits import HISTORY_DEVICES, HISTORY_MODELS, HISTORY_SAMPLES


@pytest.mark.parametrize(
    ("values", "cap", "expected"),
    [
        ({}, 3, {}),
        ({"a": 1, "b": 2}, 3, {"a": 1, "b": 2}),
        ({"a": 1, "b": 2, "c": 3}, 3, {"a": 1, "b": 2, "c": 3}),
        ({"a": 1, "b": 2, "c": 3, "d": 4}, 3, {"d": 4, "c": 3, OTHER: 3}),
        ({"a": 5, "b": 5, "c": 1, "d": 1}, 2, {"a": 5, OTHER: 7}),  # ties: by name
        ({"x": 0.5, "y": 1.5, "z": 2.0}, 2, {"z": 2.0, OTHER: 2.0}),
    ],
)
def test_top_models(values, cap, expected):
    assert top_models(values, cap) == expected


def s(t, memory=None, util=None, tps=None) -> Sample:
    return Sample(t, memory or {}, util or {}, tps or {})


@pytest.mark.parametrize(
    ("bucket", "expected"),
    [
        ([s(1, {"g": {"a": 10}})], s(1, {"g": {"a": 10}})),
        # a model absent from a sample held nothing then
        ([s(1, {"g": {"a": 10}}), s(2, {"g": {}})], s(2, {"g": {"a": 5}})),
        ([s(1, {"g": {"a": 10}}), s(2, {"g": {"a": 20, "b": 4}})], s(2, {"g": {"a": 15, "b": 2}})),
        # utilization: the mean of the samples that report it
        ([s(1, util={"g": 50}), s(2), s(3, util={"g": 100})], s(3, {}, {"g": 75.0})),
        ([s(1, tps={"a": 30}), s(2), s(3, tps={"a": 30, "b": 3})], s(3, tps={"a": 20, "b": 1})),
    ],
)
def test_merge(bucket, expected):
    assert merge(bucket) == expected


@pytest.mark.parametrize(
    ("count", "points", "sizes"),
    [
        (0, 10, []),
        (5, 10, [1, 1, 1, 1, 1]),  # fewer samples than points pass unchanged
        (10, 10, [1] * 10),
        (10, 5, [2] * 5),
        (10, 3, [4, 3, 3]),  # the newest run is never the short one's only sample
        (300, 1, [300]),
        (7, 2, [4, 3]),
        (3, 0, []),
    ],
)
def test_downsample_sizes(count, points, sizes):
    samples = [s(t, tps={"a": 1}) for t in range(count)]
    out = downsample(samples, points)
    assert len(out) == len(sizes)
    if out:
        assert out[-1].t == count - 1  # the newest sample ends the last point
    edges = [o.t for o in out]
    assert edges == sorted(edges)
    # every sample is in exactly one run: the runs' lengths add up
    ends = [-1, *[int(o.t) for o in out]]
    assert [b - a for a, b in pairwise(ends)] == sizes


def test_downsample_keeps_the_mean():
    samples = [s(t, {"g": {"a": 100 * t}}) for t in range(4)]
    assert downsample(samples, 2) == [s(1, {"g": {"a": 50}}), s(3, {"g": {"a": 250}})]


def test_the_ring_keeps_the_last_ten_minutes():
    ring = HistoryRing()
    for t in range(HISTORY_SAMPLES.value + 25):
        ring.add(s(float(t)))
    assert len(ring) == HISTORY_SAMPLES.value == 300
    assert ring.samples()[0].t == 25 and ring.samples()[-1].t == HISTORY_SAMPLES.value + 24


def test_a_sample_is_bounded():
    many = {f"m{i}": i + 1 for i in range(50)}
    devices = {f"GPU-{i}": dict(many) for i in range(40)}
    kept = bounded(Sample(1, devices, {f"GPU-{i}": 1.0 for i in range(40)}, dict(many)))
    assert len(kept.memory) == HISTORY_DEVICES.value
    assert all(len(m) == HISTORY_MODELS.value for m in kept.memory.values())
    assert len(kept.tokens_per_second) == HISTORY_MODELS.value
    assert len(kept.utilization) == HISTORY_DEVICES.value
    # nothing is lost in the sums
    assert sum(kept.memory["GPU-0"].values()) == sum(many.values())


def test_the_body():
    ring = HistoryRing()
    ring.devices = [{"id": "g", "name": "G", "library": "CUDA", "total_memory": 8}]
    for t in range(6):
        ring.add(s(t, {"g": {"a": t}}, {"g": 10.0}, {"a": 2.0}))
    body = history_body(ring, 3, 2.0, running=True)
    assert body["window"] == 600 and body["interval"] == 2.0 and body["sampling"] is True
    assert body["devices"] == ring.devices
    assert [p["t"] for p in body["samples"]] == [1, 3, 5]
    assert body["samples"][-1] == {
        "t": 5, "memory": {"g": {"a": 4}}, "utilization": {"g": 10.0},
        "tokens_per_second": {"a": 2.0},
    }  # fmt: skip
    json.dumps(body)


@pytest.mark.parametrize(
    ("before", "after", "seconds", "expected"),
    [
        ({}, {"a": 20}, 2.0, {"a": 10.0}),
        ({"a": 20}, {"a": 20}, 2.0, {}),  # nothing new: no rate
        ({"a": 20, "b": 1}, {"a": 50, "b": 4}, 3.0, {"a": 10.0, "b": 1.0}),
        ({"a": 1}, {"a": 5}, 0.0, {}),
    ],
)
def test_rates(before, after, seconds, expected):
    assert rates(before, after, seconds) == expected


def test_the_tally_is_capped_to_the_models_that_generated_last():
    tally = TokenTally(cap=2)
    for model in ("a", "b", "b", "c", "d", "d", "a"):
        tally.add(model)
    # not the first two models seen for ever: a model new to the server is its own
    assert tally.totals() == {"d": 2, "a": 1}
    before = tally.totals()
    tally.add("e")  # "d" forgotten: its rate is left out, never negative
    assert rates(before, tally.totals(), 1.0) == {"e": 1.0}


def alloc(device, total):
    return SimpleNamespace(device=device, total=total)


def test_memory_by_model():
    devices = [DeviceInfo("GPU-0", "CUDA", "A"), DeviceInfo("GPU-1", "CUDA", "B"),
               DeviceInfo("cpu", "CPU", "CPU")]  # fmt: skip
    loaded = [
        SimpleNamespace(key="a", node="", allocations=(alloc("GPU-0", 5), alloc("cpu", 1))),
        SimpleNamespace(key="b", node="", allocations=(alloc("GPU-0", 7),)),
        SimpleNamespace(key="c", node="n1", allocations=(alloc("GPU-0", 3),)),
    ]
    assert memory_by_model(devices, loaded) == {
        "GPU-0": {"a": 5, "b": 7}, "GPU-1": {}, "cpu": {"a": 1}, "n1/GPU-0": {"c": 3},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([{"id": "g"}], {}),
        ([{"id": "g", "utilization": 40}, {"id": "h"}], {"g": 40.0}),
        ([{"id": "g", "utilization": 0}, {"id": "h", "utilization": 100.0}], {"g": 0, "h": 100}),
    ],
)
def test_simulated_utilization(devices, expected):
    assert parse_simulated_utilization(json.dumps(devices)) == expected


@pytest.mark.parametrize("bad", [-1, 101, "50", True, None])
def test_simulated_utilization_is_a_percent(bad):
    with pytest.raises(ConfigError, match="utilization must be a percent"):
        parse_simulated_utilization(json.dumps([{"id": "g", "utilization": bad}]))


def test_nvml_utilization_by_our_ids():
    devices = [
        DeviceInfo("GPU-aa", "CUDA", "A"),
        DeviceInfo("0000:01:00.0", "CUDA", "B", pci_id="0000:01:00.0"),
        DeviceInfo("GPU-cc", "Vulkan", "C"),
        DeviceInfo("GPU-dd", "CUDA", "D"),
        # a cluster node's GPU on the same bus id as one here: not this NVML's
        DeviceInfo("n1/0000:01:00.0", "CUDA", "E", pci_id="0000:01:00.0", node="n1"),
    ]
    nvml = {"gpu-aa": 30.0, "00000000:01:00.0": 70.0, "gpu-cc": 5.0}
    assert utilization_of(devices, nvml) == {"GPU-aa": 30.0, "0000:01:00.0": 70.0}
