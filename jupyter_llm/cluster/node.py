"""What runs on each Ray node, as actors (``cluster.ray_cluster`` makes them remote).

``NodeDiscovery`` (one per node) lists the node's devices with the same
``DeviceSource`` and discovery runner a single server uses, so a node's
simulated devices (``JUPYTER_LLM_SIMULATED_DEVICES`` in its environment),
NVML and ggml backends all count as they do locally, and computes a load's
launch (GPU visibility is the node's). ``NodeRunner`` (one per loaded model)
owns a real ``RunnerProcess`` on its node and relays the runner protocol;
the runner exits when the actor's process dies (its socket closes).

Nothing here imports ray: these classes are plain, tested as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from jupyter_llm.cluster.blobs import BlobReceiver
from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceInfo, DeviceSource, device_from_raw
from jupyter_llm.request.errors import ModelLoadFailed
from jupyter_llm.runner.protocol import Complete, Embed
from jupyter_llm.runner_client.device_probe import discover_raw_devices
from jupyter_llm.runner_client.launch import LoadRequest, LoadSpec, launch_spec
from jupyter_llm.runner_client.proxy import RunnerProxy, start_runner_with

_DONE = object()


def node_settings() -> Settings:
    """The node's own settings (its environment): runner interpreter, store."""
    return Settings.from_env()


class NodeDiscovery:
    """A node's devices, free memory and launches."""

    def __init__(self) -> None:
        self.settings = node_settings()

        async def discover() -> list[DeviceInfo]:
            raw = await discover_raw_devices(self.settings.python, strict=True)
            return [device_from_raw(r) for r in raw]

        self.source = DeviceSource(discover, python=self.settings.python)

    async def devices(self, used: dict[str, int]) -> tuple[list[DeviceInfo], bool, str]:
        """This node's devices (ids as the node knows them), whether they are
        simulated, and why discovery failed ("" if it did not)."""
        devices = await self.source.devices(used=used)
        return devices, self.source.simulated, self.source.discovery_error

    def launch(self, request: LoadRequest) -> LoadSpec:
        """The runner's launch on this node: its environment decides GPU
        visibility, its simulated devices make the runner compute on the CPU."""
        return launch_spec(replace(request, simulated=self.source.simulated), os.environ)


class NodeRunner:
    """One model's runner on this node, relayed to the engine."""

    def __init__(self) -> None:
        self.blobs = BlobReceiver(node_settings().models_dir / "blobs")
        self.runner: RunnerProxy | None = None
        self._closed = asyncio.Event()

    # -- blobs -------------------------------------------------------------------------
    def shared(self, path: str, size: int) -> bool:
        return self.blobs.shared(path, size)

    def cached(self, digest: str, size: int) -> str | None:
        return self.blobs.cached(digest, size)

    def write_blob(self, digest: str, offset: int, data: bytes) -> None:
        self.blobs.write(digest, offset, data)

    def finish_blob(self, digest: str) -> str:
        return self.blobs.finish(digest)

    # -- the runner --------------------------------------------------------------------
    async def load(self, spec: LoadSpec, stall_timeout: float) -> AsyncIterator[dict[str, Any]]:
        """Start the runner and load ``spec``: yields ``{"progress"}`` as it
        goes, then ``{"info", "pid", "load_duration_ns"}``."""
        progress: asyncio.Queue[Any] = asyncio.Queue()

        async def start() -> RunnerProxy:
            try:
                return await start_runner_with(
                    spec, load_timeout=stall_timeout, report=progress.put_nowait
                )
            finally:
                progress.put_nowait(_DONE)

        task = asyncio.ensure_future(start())
        try:
            while (fraction := await progress.get()) is not _DONE:
                yield {"progress": fraction}
            self.runner = await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        yield {
            "info": self.runner.info,
            "pid": self.runner.pid,
            "load_duration_ns": self.runner.load_duration_ns,
        }

    def _loaded(self) -> RunnerProxy:
        if self.runner is None:
            raise ModelLoadFailed("no model is loaded on this node's runner")
        return self.runner

    async def complete(self, request: Complete) -> AsyncIterator[list[dict[str, Any]]]:
        """The runner's batches of token messages; closing this generator (the
        engine cancelled it) cancels the request in the runner."""
        stream = self._loaded().complete(request)
        try:
            async for batch in stream:
                yield batch
        finally:
            await stream.aclose()

    async def embed(self, request: Embed) -> dict[str, Any]:
        return await self._loaded().embed(request)

    async def health(self, timeout: float) -> bool:
        return self.runner is not None and await self.runner.health(timeout)

    async def device_info(self) -> list[dict[str, Any]]:
        return await self._loaded().device_info()

    def alive(self) -> bool:
        return self.runner is not None and self.runner.alive

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.close()
        self._closed.set()

    async def until_gone(self) -> None:
        """Returns once closed or once the runner process exited: the engine
        keeps one call waiting here, and learns that the actor (or its node)
        died when the call fails."""
        waits = [asyncio.ensure_future(self._closed.wait())]
        if self.runner is not None:
            waits.append(asyncio.ensure_future(self.runner.process.exited()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
