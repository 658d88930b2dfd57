"""Placement across nodes, without Ray: the pure rules, and the scheduler
driven by a device source that reports two nodes (fake runners)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
from scheduler_env import GiB, entry, info, make, simulated, use

from jupyter_llm.cluster.rules import as_node_devices, node_used, serving_nodes
from jupyter_llm.devices import DeviceInfo, DeviceSource, nodes_by_free, on_node
from jupyter_llm.scheduler import LoadOptions, eviction_node


def gpu(node: str, free_gib: float, id: str = "gpu0") -> DeviceInfo:
    size = int(free_gib * GiB)
    return DeviceInfo(id=on_node(node, id), library="CUDA", name=id, total_memory=size,
                      free_memory=size, node=node)  # fmt: skip


def cpu(node: str) -> DeviceInfo:
    return DeviceInfo(id=on_node(node, "cpu"), library="CPU", name="CPU",
                      total_memory=64 * GiB, free_memory=64 * GiB, node=node)  # fmt: skip


@pytest.mark.parametrize(
    ("node", "device", "expected"),
    [("", "gpu0", "gpu0"), ("", "cpu", "cpu"), ("n1", "gpu0", "n1/gpu0"),
     ("n1", "cpu", "n1/cpu"), ("n1", "n1/gpu0", "n1/gpu0")],
)  # fmt: skip
def test_on_node(node, device, expected):
    assert on_node(node, device) == expected


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([gpu("", 8), cpu("")], [""]),  # no cluster: the one machine
        ([gpu("a", 4), gpu("b", 8), cpu("a"), cpu("b")], ["b", "a"]),
        ([gpu("b", 4), gpu("a", 4), cpu("a"), cpu("b")], ["a", "b"]),  # a tie: by id
        ([cpu("head"), gpu("a", 1), cpu("a")], ["a", "head"]),  # no GPU: last
    ],
)
def test_nodes_by_free(devices, expected):
    assert nodes_by_free(devices) == expected


def test_node_used_and_node_devices():
    used = {"a/gpu0": 5, "a/cpu": 7, "b/gpu0": 1}
    assert node_used(used, "a") == {"gpu0": 5, "cpu": 7}
    assert node_used(used, "c") == {}
    local = [DeviceInfo(id="gpu0", library="CUDA", name="g"), DeviceInfo("cpu", "CPU", "CPU")]
    assert [(d.id, d.node) for d in as_node_devices("a", local)] == [
        ("a/gpu0", "a"),
        ("a/cpu", "a"),
    ]


def ray_node(id: str, alive: bool = True, gpus: float = 0) -> dict:
    return {
        "NodeID": id,
        "Alive": alive,
        "Resources": {"CPU": 1.0, **({"GPU": gpus} if gpus else {})},
    }


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([ray_node("head"), ray_node("w1", gpus=1), ray_node("w2", gpus=2)], ["w1", "w2"]),
        ([ray_node("head"), ray_node("w1", alive=False, gpus=1)], ["head"]),  # CPUs only now
        ([ray_node("head"), ray_node("w1")], ["head", "w1"]),  # a CPU cluster
        ([ray_node("w1", alive=False)], []),
    ],
)
def test_serving_nodes(nodes, expected):
    assert [n["NodeID"] for n in serving_nodes(nodes)] == expected


class Node:
    def __init__(self, name: str) -> None:
        self.node = name


@pytest.mark.parametrize(
    ("loaded", "fits", "expected"),
    [
        ([], set(), ""),  # nothing loaded: nowhere to make room
        (["a", "b"], {"a", "b"}, "b"),  # b has more free memory: tried first
        (["a", "b"], {"a"}, "a"),  # only a's room would do
        (["a"], {"b"}, "a"),  # b has no models to evict: make what room a has
        (["a", "b"], set(), "b"),  # fits nowhere: the first node with models
    ],
)
def test_eviction_node(loaded, fits, expected):
    devices = [gpu("a", 2), cpu("a"), gpu("b", 4), cpu("b")]
    assert eviction_node(devices, [Node(n) for n in loaded], lambda n: n in fits) == expected


class TwoNodes(DeviceSource):
    """Node "small" with a 12 GiB GPU, node "large" with a 16 GiB GPU, each
    device net of what our runners hold (as a node's discovery reports it)."""

    def __init__(self) -> None:
        super().__init__(_never, environ={})
        self.base = [gpu("small", 12), cpu("small"), gpu("large", 16), cpu("large")]

    async def devices(self, used: Mapping[str, int] | None = None, fresh=None):
        used = used or {}
        return [replace(d, free_memory=d.free_memory - used.get(d.id, 0)) for d in self.base]


async def _never():
    raise AssertionError("no discovery")


def two_nodes(**settings):
    s, f = make(simulated([("unused", GiB, False)]), **settings)
    s.devices = TwoNodes()
    return s, f


async def test_models_that_cannot_share_go_to_different_nodes():
    s, f = two_nodes()
    a = await use(s, entry("a"))  # 7B-like: 6.9 GiB estimated, one per GPU
    b = await use(s, entry("b"))
    assert (a.node, b.node) == ("large", "small")  # most free memory first
    assert [sp.env for sp in f.specs] == [(("CUDA_VISIBLE_DEVICES", "0"),)] * 2
    assert a.placement.gpus == ["large/gpu0"] and b.placement.gpus == ["small/gpu0"]


async def test_eviction_stays_on_the_node_that_gets_the_model():
    s, f = two_nodes()
    await use(s, entry("a"))  # large
    await use(s, entry("b"))  # small
    # c needs more than the small GPU has even when empty: only large will do,
    # so a goes, although b (on small) is the one the global rule would pick
    big = info(layer_mib=400)
    (await s.acquire(entry("a"), LoadOptions(), None)).release()  # b: least recently used
    c = await use(s, entry("c", big))
    assert c.node == "large"
    assert sorted((m.key, m.node) for m in s.loaded_models()) == [
        ("b:latest", "small"), ("c:latest", "large")]  # fmt: skip
    assert not f.runners[0].alive and f.runners[1].alive


def test_ray_address_without_ray_is_a_clear_config_error(monkeypatch):
    import sys

    from jupyter_llm.cluster import ray_services
    from jupyter_llm.config import Settings
    from jupyter_llm.request.errors import ConfigError

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    for name in ("connect", "runner", "source"):
        monkeypatch.delitem(sys.modules, f"jupyter_llm.cluster.{name}", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'jupyter-llm\[ray\]'"):
        ray_services(Settings(ray_address="auto"))
