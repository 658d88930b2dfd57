"""``RunnerProxy``: the server's handle on a runner process with a model loaded,
as the scheduler sees it; ``start_serving_runner`` is the production runner
factory.

While a request is in flight a watchdog asks the runner's reader thread for the
main loop's progress: a runner busy without progress for ``stall_timeout`` (a
decode that never returns, a deadlock) is killed, so its request fails with a
clear error and the next one loads a fresh runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

from jupyter_llm.memory.measured import is_sizes
from jupyter_llm.request.errors import AllocationFailed, ModelLoadFailed, RunnerFailed
from jupyter_llm.runner.protocol import Complete, Embed, Health, ProtocolError, fields_of, read
from jupyter_llm.runner_client.decode_threads import DecodeThreads
from jupyter_llm.runner_client.launch import (
    LoadRequest,
    LoadSpec,
    PromptDisk,
    launch_spec,
    prompt_disk_spec,
    prompt_ram_spec,
)
from jupyter_llm.runner_client.process import RunnerProcess

log = logging.getLogger(__name__)

HEALTH_POLL_MAX = 5.0  # seconds between the watchdog's health checks, at most
# JSON of one embedding message from the runner: the event loop decodes each
# (a list of strings, one per vector) in well under a millisecond.
EMBED_PART_BYTES = 64 << 10


class RunnerProxy:
    def __init__(self, process: RunnerProcess, spec: LoadSpec, stall_timeout: float) -> None:
        self.process = process
        self.spec = spec
        self.stall_timeout = stall_timeout
        self.info: dict[str, Any] = {}
        self.progress = 0.0
        self.load_duration_ns = 0
        self.threads = DecodeThreads()
        self._held: dict[str, dict[str, int]] | None = None  # since the load: ``_holds``

    @property
    def alive(self) -> bool:
        return self.process.alive

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def n_ctx(self) -> int:
        return int(self.info.get("n_ctx", self.spec.n_ctx))

    @property
    def n_seq(self) -> int:
        """The sequences the runner really decodes together (its slots)."""
        return max(1, int(self.info.get("n_seq", self.spec.n_seq)))

    @property
    def kv_cache_fallback(self) -> str:
        """Why the runner's KV cache is f16 though the load asked for another ("" if not)."""
        return str(self.info.get("kv_cache_fallback", ""))[:200]

    @property
    def n_threads(self) -> int:
        """The CPU threads the runner decodes with (its default unless the spec set one)."""
        return self.threads.loaded or self.spec.n_threads

    async def load(self, report: Callable[[float], None] | None = None) -> None:
        """Load the model; the stall timer restarts whenever load progress
        moves, and ``report`` is told each fraction."""
        started = time.perf_counter_ns()
        replies = self.process.stream_batches("load", **fields_of(self.spec.load_params))
        try:
            while not self.info:
                batch = await asyncio.wait_for(anext(replies), self.stall_timeout)
                for message in batch:
                    if message.get("type") == "progress":
                        self.progress = float(message.get("progress", 0.0))
                        if report is not None:
                            report(self.progress)
                    else:
                        self.info = message
                        self.threads = DecodeThreads.from_load(message)
        except TimeoutError:
            raise ModelLoadFailed(
                f"timed out loading the model: no progress for {self.stall_timeout:.0f}s"
                f" (at {self.progress:.0%})"
            ) from None
        except StopAsyncIteration:
            raise ModelLoadFailed("the runner ended the load without an answer") from None
        except AllocationFailed as e:
            raise AllocationFailed(f"failed to load model: {e}") from e
        except RunnerFailed as e:
            raise ModelLoadFailed(f"failed to load model: {e}") from e
        finally:
            await replies.aclose()
        self.load_duration_ns = time.perf_counter_ns() - started
        adaptive = " (fewer while other work holds the cores)"
        log.info(
            "runner %s loaded the model in %.1fs: %s CPU threads%s, n_ctx %d",
            self.pid,
            self.load_duration_ns / 1e9,
            self.threads.loaded or "?",
            adaptive if self.threads.adaptive else "",
            self.n_ctx,
        )

    @property
    def measured(self) -> dict[str, dict[str, int]]:
        """Bytes llama.cpp allocated per backend buffer ("cpu", "CUDA0", ...):
        what the runner said it holds at a request's end, else its load's."""
        return dict(self._held or self.measured_at_load)

    @property
    def measured_at_load(self) -> dict[str, dict[str, int]]:
        """What the load allocated, as its reply said."""
        return dict(self.info.get("allocations") or {})

    def _holds(self, allocations: Any) -> None:
        """A request's end said what the runner holds now (it changed)."""
        if is_sizes(allocations):
            self._held = allocations

    async def device_info(self) -> list[dict[str, Any]]:
        """The runner's view of its devices' free memory (answered mid-generation)."""
        reply = await asyncio.wait_for(self.process.call("info"), 5.0)
        return list(reply.get("devices", []))

    async def complete(self, request: Complete) -> AsyncIterator[list[dict[str, Any]]]:
        """Stream batches of ``token`` messages ending with ``done``."""
        async with self._watched():
            stream = self.process.stream_batches("complete", **fields_of(request))
            try:
                async for batch in stream:
                    self.threads.saw(batch)
                    for message in batch:
                        if message.get("type") == "done":
                            self._holds(message.get("allocations"))
                    yield batch
            finally:
                await stream.aclose()

    async def embed(self, request: Embed) -> dict[str, Any]:
        """The runner's result with ``vectors``: each vector as the JSON text
        the response holds for it, gathered from the runner's small parts and
        never decoded here (the handler writes them as they are). What is
        held is bounded by ``EMBED_INPUTS`` vectors of at most the model's
        size; the runner refuses more than ``EMBED_TOKENS`` before any work."""
        request = replace(request, part_bytes=min(self.process.limit // 4, EMBED_PART_BYTES))
        vectors: list[str] = []
        async with self._watched():
            async for message in self.process.stream("embed", **fields_of(request)):
                if message.get("type") == "embedding":
                    vectors.extend(message["vectors"])
                else:
                    self._holds(message.pop("allocations", None))
                    return {**message, "vectors": vectors}
        raise RunnerFailed("the runner ended an embedding without an answer")

    async def health(self, timeout: float = 5.0) -> bool:
        """Alive, answering, and not stuck in the middle of a request."""
        try:
            reply = read(Health, await asyncio.wait_for(self.process.call("health"), timeout))
        except (TimeoutError, RunnerFailed, ProtocolError):
            return False
        stuck = reply.busy is not None and reply.stalled_for >= self.stall_timeout
        return reply.status == "ok" and not stuck

    async def close(self, reason: RunnerFailed | None = None) -> None:
        await self.process.close(reason=reason)

    def kill(self) -> None:
        self.process.kill()

    # -- the watchdog ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _watched(self) -> AsyncIterator[None]:
        watchdog = asyncio.create_task(self._watch())
        try:
            yield
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog

    async def _watch(self) -> None:
        """Kill the runner once it has been busy (or silent) without progress
        for ``stall_timeout``. Progress is the runner's own counter of main-loop
        steps (prompt chunks, tokens, embeddings), read by its reader thread."""
        poll = min(HEALTH_POLL_MAX, max(self.stall_timeout / 4, 0.01))
        seen: int | None = None
        since = time.monotonic()
        while self.alive:
            await asyncio.sleep(poll)
            reply: Health | None
            try:
                answer = await asyncio.wait_for(self.process.call("health"), max(poll, 1.0))
                reply = read(Health, answer)
            except (TimeoutError, RunnerFailed, ProtocolError):
                reply = None  # silent: counts as no progress
            now = time.monotonic()
            if reply is not None and (reply.busy is None or reply.progress != seen):
                seen, since = reply.progress, now
            elif now - since >= self.stall_timeout:
                self.process.kill(reason=f"made no progress for {self.stall_timeout:g}s")
                return


async def start_serving_runner(
    request: LoadRequest,
    report: Callable[[float], None],
    *,
    python: str = "",
    load_timeout: float,
    environ: Mapping[str, str] | None = None,
    prompt_disk: PromptDisk | None = None,
    prompt_ram: int = 0,
) -> RunnerProxy:
    """Spawn a runner and load ``request`` into it; no runner is left behind on
    failure; ``report`` is told the load's progress. ``load_timeout`` is both
    the load's stall timer and the watchdog's. ``prompt_disk``: where the
    runner keeps long prefixes (runner/prompt_disk.py); ``prompt_ram``: the
    bytes it keeps in memory (runner/prompt_ram.py)."""
    spec = launch_spec(request, os.environ if environ is None else environ)
    spec = replace(
        spec,
        prompt_disk=prompt_disk_spec(request, prompt_disk),
        prompt_ram=prompt_ram_spec(prompt_ram),
    )
    return await start_runner_with(spec, python=python, load_timeout=load_timeout, report=report)


async def start_runner_with(
    spec: LoadSpec,
    *,
    python: str = "",
    load_timeout: float,
    report: Callable[[float], None] | None = None,
) -> RunnerProxy:
    """Spawn a runner and load an explicit ``LoadSpec`` (tests, benchmarks, a
    cluster node), telling ``report`` the load's progress."""
    process = RunnerProcess(python=python, env=dict(spec.env), label="runner")
    await process.start()
    runner = RunnerProxy(process, spec, stall_timeout=load_timeout)
    try:
        await runner.load(report)
    except BaseException:
        await process.close(timeout=2.0)
        raise
    return runner
