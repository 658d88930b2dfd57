"""The cluster's pure rules: which nodes serve, how a node's device ids and
memory counts read from the engine's side. No Ray here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from jupyter_llm.devices import DeviceInfo, on_node


def serving_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alive nodes (``ray.nodes()`` records) runners may go to: those that
    offer GPUs to Ray, or every alive node where none does (a CPU cluster)."""
    alive = [n for n in nodes if n.get("Alive")]
    with_gpus = [n for n in alive if n.get("Resources", {}).get("GPU", 0) > 0]
    return with_gpus or alive


def node_used(used: Mapping[str, int], node: str) -> dict[str, int]:
    """What our runners hold on ``node``, keyed as the node knows its devices."""
    prefix = f"{node}/"
    return {k[len(prefix) :]: v for k, v in used.items() if k.startswith(prefix)}


def as_node_devices(node: str, devices: list[DeviceInfo]) -> list[DeviceInfo]:
    """A node's devices as the engine sees them: ids ``<node>/<id>``, the node set."""
    return [replace(d, id=on_node(node, d.id), node=node) for d in devices]
