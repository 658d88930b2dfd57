"""Fakes at the process boundary, for tests and benchmarks of the scheduler:
a runner that answers at once, and a factory that records what it was asked
to load (and can fail like an out-of-memory GPU would, with the typed error a
real runner sends)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from jupyter_llm.memory import ModelInfo
from jupyter_llm.request.errors import AllocationFailed, RunnerFailed
from jupyter_llm.runner.protocol import Complete, Done, Embed, fields_of
from jupyter_llm.runner_client.decode_threads import DecodeThreads
from jupyter_llm.runner_client.launch import LoadRequest, LoadSpec, launch_spec

_pids = itertools.count(100_000)


class FakeRunner:
    """Implements the scheduler's ``Runner`` protocol without a process."""

    def __init__(
        self,
        spec: LoadSpec,
        gpus: list[dict[str, Any]] | None = None,
        measured: dict[str, dict[str, int]] | None = None,
        latency: float = 0.0,
    ) -> None:
        self.spec = spec
        self.load_duration_ns = 5
        self.pid = next(_pids)
        self.gpus = gpus or []
        self.measured = measured or {}  # what it holds now (a test may grow it)
        self.measured_at_load = dict(self.measured)
        self.kv_cache_fallback = ""  # the real runner's reason when llama.cpp refused the type
        self.threads = DecodeThreads(spec.n_threads, False, spec.n_threads)
        self.latency = latency
        self.info_calls = 0
        self.close_reason: RunnerFailed | None = None  # what ``close`` was told
        self._alive = True

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def n_ctx(self) -> int:
        return self.spec.n_ctx

    @property
    def n_seq(self) -> int:
        return self.spec.n_seq

    async def complete(self, request: Complete) -> AsyncIterator[list[dict[str, Any]]]:
        if self.latency:
            await asyncio.sleep(self.latency)
        yield [{"type": "done", **fields_of(Done(eval_count=1))}]

    async def embed(self, request: Embed) -> dict[str, Any]:
        inputs = request.inputs
        return {"embeddings": [[1.0, 0.0] for _ in inputs], "prompt_eval_count": len(inputs)}

    async def health(self, timeout: float = 5.0) -> bool:
        return self._alive

    async def device_info(self) -> list[dict[str, Any]]:
        self.info_calls += 1
        return self.gpus

    async def close(self, reason: RunnerFailed | None = None) -> None:
        self.close_reason = reason
        self._alive = False

    def kill(self) -> None:
        self._alive = False


class FakeRunnerFactory:
    """The scheduler's runner factory; fails the first ``fail`` loads with an
    allocation error. ``specs`` are the launches a real factory would make
    (with an empty parent environment)."""

    def __init__(
        self,
        gpus: list[dict[str, Any]] | None = None,
        fail: int = 0,
        measured: dict[str, dict[str, int]] | None = None,
        latency: float = 0.0,
        kv_cache_fallback: str = "",
    ) -> None:
        self.specs: list[LoadSpec] = []
        self.runners: list[FakeRunner] = []
        self.fail, self.gpus, self.measured, self.latency = fail, gpus, measured, latency
        self.kv_cache_fallback = kv_cache_fallback  # what every runner says llama.cpp refused

    async def __call__(self, request: LoadRequest, report: Callable[[float], None]) -> FakeRunner:
        spec = launch_spec(request, environ={})
        self.specs.append(spec)
        await asyncio.sleep(0)
        if self.fail:
            self.fail -= 1
            raise AllocationFailed("failed to load model: could not allocate the KV cache")
        runner = FakeRunner(spec, self.gpus, self.measured, self.latency)
        runner.kv_cache_fallback = self.kv_cache_fallback
        self.runners.append(runner)
        return runner


def simulated_environ(gpus: list[tuple[str, int, bool]], system: int) -> dict[str, str]:
    """JUPYTER_LLM_SIMULATED_* values for (id, free bytes, integrated) GPUs."""
    devices = [
        {
            "id": id,
            "library": "Vulkan" if integrated else "CUDA",
            "name": id,
            "total_memory": free,
            "free_memory": free,
            "integrated": integrated,
        }
        for id, free, integrated in gpus
    ]
    return {
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(devices),
        "JUPYTER_LLM_SIMULATED_SYSTEM": json.dumps({"total_memory": system, "free_memory": system}),
    }


def synthetic_model(
    layer_mib: float = 200,
    n_layer: int = 32,
    *,
    n_embd: int = 4096,
    n_head: int = 32,
    n_head_kv: int = 8,
    context_length: int = 32768,
    edge_mib: float = 250,
) -> ModelInfo:
    """A llama-shaped ``ModelInfo`` without a file (defaults: 7B-like, 200 MiB
    blocks, 250 MiB output and input embeddings)."""
    mib = 1 << 20
    return ModelInfo(
        architecture="llama",
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=n_embd // n_head,
        head_dim_v=n_embd // n_head,
        n_vocab=32000,
        context_length=context_length,
        layer_bytes=(int(layer_mib * mib),) * n_layer,
        output_bytes=int(edge_mib * mib),
        input_bytes=int(edge_mib * mib),
    )
