"""The engine's handle on a Ray cluster: its alive nodes, each with a
discovery actor pinned to it, and every runner actor started there.

``ray`` is imported here and in the modules that use this one, never
elsewhere: without ``JUPYTER_LLM_RAY_ADDRESS`` nothing imports it. Calls into
Ray that block (``ray.init``, ``ray.nodes``) run in an executor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jupyter_llm.cluster.node import NodeDiscovery, NodeRunner
from jupyter_llm.cluster.rules import serving_nodes
from jupyter_llm.request.errors import NodeLost

log = logging.getLogger(__name__)

NAMESPACE = "jupyter_llm"
NODE_ID_CHARS = 12  # a node's id as devices carry it: a prefix of Ray's node id
# Ray's share of each GPU a runner holds: GPUs are counted, memory is the
# scheduler's; a whole GPU per runner would stop models from sharing one.
GPU_SHARE = 0.01


@dataclass
class Node:
    """One alive node: ``id`` as devices carry it, Ray's own id, its discovery actor."""

    id: str
    ray_id: str
    address: str
    gpus: float  # the GPUs it offers Ray
    discovery: Any

    def pinned(self) -> NodeAffinitySchedulingStrategy:
        return NodeAffinitySchedulingStrategy(node_id=self.ray_id, soft=False)


class RayCluster:
    def __init__(self, address: str) -> None:
        self.address = address
        self._nodes: dict[str, Node] = {}
        # nodes whose actors failed: Ray may list them alive for a while (until
        # its health checks give up), but nothing starts there again
        self._lost: set[str] = set()
        self.suspects: set[str] = set()  # a runner there failed: ask it briefly
        self._runners: dict[int, Any] = {}  # runner actors not yet killed
        self._names = itertools.count(1)
        self._prefix = f"jupyter-llm-{os.getpid()}"
        self._connected = False
        self._lock = asyncio.Lock()

    async def connect(self) -> None:
        async with self._lock:
            if self._connected:
                return
            if not ray.is_initialized():
                await asyncio.get_running_loop().run_in_executor(None, self._init)
            self._discovery_class = ray.remote(num_cpus=0)(NodeDiscovery)
            self._runner_class = ray.remote(num_cpus=0)(NodeRunner)
            self._connected = True

    def _init(self) -> None:
        log.info("jupyter-llm: connecting to the Ray cluster at %s", self.address)
        ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False)

    async def nodes(self) -> list[Node]:
        """The serving nodes now, each with its discovery actor (started on
        first sight; a node that went away is forgotten)."""
        await self.connect()
        raw = await asyncio.get_running_loop().run_in_executor(None, ray.nodes)
        alive = {n["NodeID"][:NODE_ID_CHARS]: n for n in serving_nodes(raw)}
        alive = {short: n for short, n in alive.items() if short not in self._lost}
        for gone in set(self._nodes) - set(alive):
            self.forget(gone)
        for short, n in alive.items():
            if short not in self._nodes:
                self._nodes[short] = self._start_discovery(short, n)
        return [self._nodes[short] for short in sorted(alive)]

    def _start_discovery(self, short: str, raw: dict[str, Any]) -> Node:
        strategy = NodeAffinitySchedulingStrategy(node_id=raw["NodeID"], soft=False)
        actor = self._discovery_class.options(
            name=f"{self._prefix}-discovery-{short}", scheduling_strategy=strategy
        ).remote()
        return Node(
            id=short,
            ray_id=raw["NodeID"],
            address=str(raw.get("NodeManagerAddress", "")),
            gpus=float(raw.get("Resources", {}).get("GPU", 0)),
            discovery=actor,
        )

    def node(self, short: str) -> Node:
        if (node := self._nodes.get(short)) is None:
            raise NodeLost(f"the Ray node {short} is no longer in the cluster")
        return node

    def forget(self, short: str) -> None:
        """Drop a node's discovery actor (shutdown, or the node left the cluster)."""
        self.suspects.discard(short)
        if (node := self._nodes.pop(short, None)) is not None:
            self._kill(node.discovery)

    def lose(self, short: str) -> None:
        """A node's discovery actor failed: the node is gone for good (a node
        that rejoins has a new id)."""
        self._lost.add(short)
        self.forget(short)

    def start_runner(self, node: Node, gpus: int) -> tuple[int, Any]:
        """A runner actor pinned to ``node``, holding a share of ``gpus`` GPUs."""
        number = next(self._names)
        actor = self._runner_class.options(
            name=f"{self._prefix}-runner-{number}",
            scheduling_strategy=node.pinned(),
            num_gpus=GPU_SHARE * gpus if gpus and node.gpus > 0 else 0,
            max_restarts=0,
        ).remote()
        self._runners[number] = actor
        return number, actor

    def stop_runner(self, number: int) -> None:
        if (actor := self._runners.pop(number, None)) is not None:
            self._kill(actor)

    def close(self) -> None:
        """Kill every actor this engine started (their runner processes exit
        with them); synchronous, for shutdown paths."""
        for number in list(self._runners):
            self.stop_runner(number)
        for short in list(self._nodes):
            self.forget(short)

    @staticmethod
    def _kill(actor: Any) -> None:
        try:
            ray.kill(actor, no_restart=True)
        except Exception as e:  # already gone, or Ray is shutting down
            log.debug("could not kill a Ray actor: %s", e)
