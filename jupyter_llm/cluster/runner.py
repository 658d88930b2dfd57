"""``RayRunner``: the scheduler's ``Runner`` for a model loaded by a
``NodeRunner`` actor on a cluster node; ``start_ray_runner`` is the runner
factory on a cluster.

Tokens come back through a Ray streaming generator, one item per batch of
runner messages. Errors the node's runner raised (a bad request, a failed
load) reach the client as they would locally; the actor or its node going
away is ``NodeLost`` (503), and the runner is then dead to the scheduler,
which drops its model from the accounting and loads it elsewhere next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError

from jupyter_llm.cluster.blobs import CHUNK, digest_of_name, file_digest, read_chunk
from jupyter_llm.cluster.ray_cluster import Node, RayCluster
from jupyter_llm.request.errors import LLMError, ModelLoadFailed, NodeLost, RunnerFailed
from jupyter_llm.runner.protocol import Complete, Embed
from jupyter_llm.runner_client.decode_threads import DecodeThreads
from jupyter_llm.runner_client.launch import LoadRequest, LoadSpec

log = logging.getLogger(__name__)


def _cause(e: RayError, node: Node) -> LLMError:
    """What a client reads for a failed Ray call: the node's own error, or NodeLost."""
    if isinstance(e, RayTaskError):
        cause = e.cause
        if isinstance(cause, LLMError):
            return cause
        return RunnerFailed(f"the runner on Ray node {node.id} failed: {cause!r}")
    return NodeLost(
        f"the Ray node {node.id} ({node.address}) serving this model went away "
        f"({type(e).__name__}); the next request loads the model on a node with room"
    )


class RayRunner:
    def __init__(self, cluster: RayCluster, node: Node, number: int, actor: Any) -> None:
        self.cluster, self.node, self.number, self.actor = cluster, node, number, actor
        self.spec: LoadSpec | None = None
        self.info: dict[str, Any] = {}
        self.load_duration_ns = 0
        self.threads = DecodeThreads()
        self._pid: int | None = None
        self._gone: LLMError | None = None
        self._stopped: RunnerFailed | None = None  # why the scheduler closed it, if said
        self._watch: asyncio.Future[None] | None = None

    # -- what the scheduler reads ------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._gone is None

    @property
    def pid(self) -> int | None:
        """The runner process's pid on its node."""
        return self._pid

    @property
    def n_ctx(self) -> int:
        return int(self.info.get("n_ctx", self.spec.n_ctx if self.spec else 0))

    @property
    def n_seq(self) -> int:
        return max(1, int(self.info.get("n_seq", self.spec.n_seq if self.spec else 1)))

    @property
    def measured(self) -> dict[str, dict[str, int]]:
        return dict(self.info.get("allocations") or {})

    @property
    def measured_at_load(self) -> dict[str, dict[str, int]]:
        return self.measured  # a node's runner tells its load only

    @property
    def kv_cache_fallback(self) -> str:
        return str(self.info.get("kv_cache_fallback", ""))[:200]

    # -- calls ---------------------------------------------------------------------------
    async def _call(self, ref: Any) -> Any:
        try:
            return await ref
        except RayError as e:
            raise self._failed(e) from None

    def _failed(self, e: RayError) -> LLMError:
        if self._stopped is not None:  # closed on purpose: that is what failed it
            return self._stopped
        error = _cause(e, self.node)
        if isinstance(error, NodeLost):
            self._gone = error
            self.cluster.suspects.add(self.node.id)  # its next devices call tells
        return error

    async def ship(self, path: str) -> str:
        """``path`` as the node reads it: the shared file, or a verified copy."""
        size = os.path.getsize(path)
        if await self._call(self.actor.shared.remote(path, size)):
            return path
        return await self.send(path)

    async def send(self, path: str, digest: str | None = None) -> str:
        """Copy ``path`` into the node's store (unless it has the blob), in
        chunks; the node checks the sha256 ``digest`` (by default the one the
        blob is named by, or the file's own) before anything uses the copy."""
        loop = asyncio.get_running_loop()
        size = os.path.getsize(path)
        digest = digest or digest_of_name(path)
        digest = digest or await loop.run_in_executor(None, file_digest, path)
        if cached := await self._call(self.actor.cached.remote(digest, size)):
            return str(cached)
        log.info("sending %s (%d bytes) to Ray node %s", path, size, self.node.id)
        for offset in range(0, max(size, 1), CHUNK):
            data = await loop.run_in_executor(None, read_chunk, path, offset)
            await self._call(self.actor.write_blob.remote(digest, offset, data))
        return str(await self._call(self.actor.finish_blob.remote(digest)))

    async def load(
        self, spec: LoadSpec, stall_timeout: float, report: Callable[[float], None]
    ) -> None:
        """Load ``spec`` on the node, telling ``report`` each fraction loaded."""
        self.spec = spec
        stream = self.actor.load.options(num_returns="streaming").remote(spec, stall_timeout)
        try:
            async for ref in stream:
                item = await ref
                if "progress" in item:
                    report(float(item["progress"]))
                else:
                    self.info = dict(item["info"])
                    self.threads = DecodeThreads.from_load(self.info)
                    self._pid = item.get("pid")
                    self.load_duration_ns = int(item.get("load_duration_ns", 0))
        except RayError as e:
            raise self._failed(e) from None
        if not self.info:
            raise ModelLoadFailed("the node's runner ended the load without an answer")
        self._watch = asyncio.ensure_future(self._watch_actor())

    async def _watch_actor(self) -> None:
        """One call waits on the actor until it closes or its runner exits:
        either way (or if the call fails, the actor or node being gone) this
        runner is dead to the scheduler."""
        try:
            await self.actor.until_gone.remote()
            self._gone = self._gone or RunnerFailed(f"the runner on Ray node {self.node.id} exited")
        except RayError as e:
            self._failed(e)
            self._gone = self._gone or NodeLost(str(e))
        except asyncio.CancelledError:
            pass

    async def complete(self, request: Complete) -> AsyncIterator[list[dict[str, Any]]]:
        if self._gone is not None:
            raise self._gone
        stream = self.actor.complete.options(num_returns="streaming").remote(request)
        finished = False
        try:
            async for ref in stream:
                batch = await ref
                self.threads.saw(batch)
                yield batch
            finished = True
        except RayError as e:
            finished = True
            raise self._failed(e) from None
        finally:
            if not finished:  # the client left: stop the generation on the node
                with contextlib.suppress(Exception):
                    ray.cancel(stream)

    async def embed(self, request: Embed) -> dict[str, Any]:
        if self._gone is not None:
            raise self._gone
        return await self._call(self.actor.embed.remote(request))

    async def health(self, timeout: float = 5.0) -> bool:
        if self._gone is not None:
            return False
        try:
            return bool(
                await asyncio.wait_for(self._call(self.actor.health.remote(timeout)), timeout + 1)
            )
        except (TimeoutError, LLMError):
            return False

    async def device_info(self) -> list[dict[str, Any]]:
        return list(await asyncio.wait_for(self._call(self.actor.device_info.remote()), 5.0))

    async def close(self, reason: RunnerFailed | None = None) -> None:
        """Close the runner on its node, then the actor; requests still
        running end with ``reason`` if given (an admin's unload)."""
        self._stopped = self._stopped or reason
        if self._gone is None:
            with contextlib.suppress(LLMError, TimeoutError):
                await asyncio.wait_for(self._call(self.actor.close.remote()), 10.0)
        self.kill()
        if self._watch is not None:
            self._watch.cancel()

    def kill(self) -> None:
        """Synchronous: the actor is killed and its runner process exits with it."""
        self._gone = self._gone or RunnerFailed("the runner was stopped")
        self.cluster.stop_runner(self.number)


async def start_ray_runner(
    request: LoadRequest,
    report: Callable[[float], None],
    *,
    cluster: RayCluster,
    load_timeout: float,
) -> RayRunner:
    """A runner actor on the request's node, with the model loaded (``report``
    told its progress); nothing is left behind on failure."""
    node = cluster.node(request.node)
    try:
        spec: LoadSpec = await node.discovery.launch.remote(request)
    except RayError as e:
        cluster.suspects.add(node.id)
        raise _cause(e, node) from None
    number, actor = cluster.start_runner(node, len(request.placement.gpus))
    runner = RayRunner(cluster, node, number, actor)
    try:
        spec = replace(
            spec,
            path=await runner.ship(spec.path),
            projector=await runner.ship(spec.projector) if spec.projector else "",
            draft=await runner.ship(spec.draft) if spec.draft else "",
        )
        await runner.load(spec, load_timeout, report)
    except BaseException:
        runner.kill()
        raise
    return runner
