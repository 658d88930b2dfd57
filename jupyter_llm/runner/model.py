"""``ModelRunner``: a runner process with a model loaded in it, as the scheduler
sees it. ``start_model_runner`` is the production runner factory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_llm.errors import ModelLoadFailed, RunnerFailed
from jupyter_llm.runner.process import RunnerProcess


@dataclass(frozen=True)
class LoadSpec:
    """Everything that fixes a runner at load time (a change means a reload)."""

    path: str
    n_ctx: int
    n_batch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    use_mmap: bool = True
    env: tuple[tuple[str, str], ...] = field(default=())  # device visibility for the runner


class ModelRunner:
    def __init__(self, process: RunnerProcess, spec: LoadSpec) -> None:
        self.process = process
        self.spec = spec
        self.info: dict[str, Any] = {}
        self.progress = 0.0
        self.load_duration_ns = 0

    @property
    def alive(self) -> bool:
        return self.process.alive

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def n_ctx(self) -> int:
        return int(self.info.get("n_ctx", self.spec.n_ctx))

    async def load(self, stall_timeout: float) -> None:
        """Load the model; ``stall_timeout`` restarts whenever load progress moves."""
        started = time.perf_counter_ns()
        args = {k: v for k, v in asdict(self.spec).items() if k != "env"}
        args["tensor_split"] = list(self.spec.tensor_split)
        replies = self.process.stream_batches("load", **args)
        try:
            while not self.info:
                batch = await asyncio.wait_for(anext(replies), stall_timeout)
                for message in batch:
                    if message.get("type") == "progress":
                        self.progress = float(message.get("progress", 0.0))
                    else:
                        self.info = message
        except TimeoutError:
            raise ModelLoadFailed(
                f"timed out loading the model: no progress for {stall_timeout:.0f}s"
                f" (at {self.progress:.0%})"
            ) from None
        except StopAsyncIteration:
            raise ModelLoadFailed("the runner ended the load without an answer") from None
        except RunnerFailed as e:
            raise ModelLoadFailed(f"failed to load model: {e}") from e
        finally:
            await replies.aclose()
        self.load_duration_ns = time.perf_counter_ns() - started

    @property
    def measured(self) -> dict[str, dict[str, int]]:
        """Bytes llama.cpp allocated per backend buffer ("cpu", "CUDA0", ...)."""
        return dict(self.info.get("allocations") or {})

    async def device_info(self) -> list[dict[str, Any]]:
        """The runner's view of its devices' free memory (answered mid-generation)."""
        reply = await asyncio.wait_for(self.process.call("info"), 5.0)
        return list(reply.get("devices", []))

    def complete(self, **request: Any) -> AsyncIterator[list[dict[str, Any]]]:
        """Stream batches of ``token`` messages ending with ``done``."""
        return self.process.stream_batches("complete", **request)

    async def embed(self, **request: Any) -> dict[str, Any]:
        return await self.process.call("embed", **request)

    async def health(self, timeout: float = 5.0) -> bool:
        try:
            reply = await asyncio.wait_for(self.process.call("health"), timeout)
        except (TimeoutError, RunnerFailed):
            return False
        return reply.get("status") == "ok"

    async def close(self) -> None:
        await self.process.close()

    def kill(self) -> None:
        self.process.kill()


async def start_model_runner(
    spec: LoadSpec, *, python: str = "", load_timeout: float
) -> ModelRunner:
    """Spawn a runner and load ``spec`` into it; no runner is left behind on failure."""
    process = RunnerProcess(python=python, env=dict(spec.env), label="runner")
    await process.start()
    runner = ModelRunner(process, spec)
    try:
        await runner.load(load_timeout)
    except BaseException:
        await process.close(timeout=2.0)
        raise
    return runner
