"""The scheduler's device source on a Ray cluster: every serving node's
devices, as that node's discovery actor sees them, each carrying its node.

Device ids become ``<node>/<id>`` (the CPU too: ``<node>/cpu``), so memory
is counted per node and device, and the scheduler (which places a model on
one node's devices) cannot tell this source from a local one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from jupyter_llm.cluster.ray_cluster import Node, RayCluster
from jupyter_llm.cluster.rules import as_node_devices, node_used
from jupyter_llm.devices import DeviceInfo, DeviceSource, NodeInfo, sort_devices

log = logging.getLogger(__name__)

DISCOVERY_TIMEOUT = 120.0  # a node's first answer starts its discovery runner
SUSPECT_TIMEOUT = 2.0  # a node where a runner was lost answers at once, or is gone


async def _no_discovery() -> list[DeviceInfo]:
    return []  # the nodes discover their own devices


class RayDeviceSource(DeviceSource):
    def __init__(self, cluster: RayCluster, python: str = "") -> None:
        super().__init__(_no_discovery, environ={}, python=python)
        self.cluster = cluster
        self._simulated_nodes: set[str] = set()
        self._known: list[Node] = []

    @property
    def simulated(self) -> bool:
        return bool(self._simulated_nodes)

    async def devices(
        self, used: Mapping[str, int] | None = None, fresh: object = None
    ) -> list[DeviceInfo]:
        """Every serving node's devices with free memory as of now; a node
        that does not answer is left out (and forgotten, if its actor died)."""
        used = used or {}
        nodes = await self.cluster.nodes()
        answers = await asyncio.gather(
            *(self._ask(n, node_used(used, n.id)) for n in nodes), return_exceptions=True
        )
        out: list[DeviceInfo] = []
        errors = []
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("Ray node %s is gone: %s", node.id, answer)
                self.cluster.lose(node.id)
                continue
            self.cluster.suspects.discard(node.id)
            devices, simulated, error = answer
            (self._simulated_nodes.add if simulated else self._simulated_nodes.discard)(node.id)
            if error:
                errors.append(f"node {node.id}: {error}")
            out.extend(as_node_devices(node.id, devices))
        self.discovery_error = "; ".join(errors)
        self._known = [
            n for n, a in zip(nodes, answers, strict=True) if not isinstance(a, BaseException)
        ]
        return sort_devices(out)

    async def _ask(self, node: Node, used: dict[str, int]) -> tuple[list[DeviceInfo], bool, str]:
        timeout = SUSPECT_TIMEOUT if node.id in self.cluster.suspects else DISCOVERY_TIMEOUT
        return await asyncio.wait_for(node.discovery.devices.remote(used), timeout)

    async def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(id=n.id, name=n.address or n.id, address=n.address) for n in self._known]

    async def close(self) -> None:
        self.cluster.close()
