"""Scheduler at scale, with simulated devices and fake runners (no processes).

1. Placement decision time with 8 simulated GPUs while up to 50 models load:
   the pure layout (``plan_layout``) and the whole load path through
   ``Scheduler.acquire`` (device snapshot, fit loop, bookkeeping; the fake runner
   itself takes no time). Target: median under 1 ms.
2. 1,000 concurrent requests across 5 models with ``max_queue`` 64: exactly the
   requests beyond the bound get 503, every other one completes, none hangs.

    .venv/bin/python benchmarks/scheduler.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceSource
from jupyter_llm.memory import EstimateOptions, GpuSlot, ModelInfo, estimate, plan_layout
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.request.errors import ServerBusy
from jupyter_llm.runner.protocol import Complete
from jupyter_llm.scheduler import LoadOptions, Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from fakes import FakeRunnerFactory, simulated_environ, synthetic_model

MiB, GiB = 1 << 20, 1 << 30


def model(i: int) -> ModelInfo:
    """50 distinct shapes: 16 to 32 blocks of 40 to 110 MiB."""
    return synthetic_model(
        40 + 7 * (i % 11),
        16 + i % 17,
        n_embd=2048,
        n_head=16,
        n_head_kv=4,
        context_length=8192,
        edge_mib=120,
    )


def entry(i: int) -> ModelEntry:
    return ModelEntry(
        name=parse_model_name(f"m{i}"),
        digest=f"d{i}",
        size=1,
        modified_at=datetime.now(UTC),
        model_path=Path(f"/m/{i}.gguf"),
        template=None,
        system=None,
        config={},
    )


def scheduler(n_gpus: int, **settings: object) -> Scheduler:
    env = simulated_environ(
        [(f"GPU-{g}", (24 - g) * GiB, g >= 6) for g in range(n_gpus)], 256 * GiB
    )

    async def no_discovery() -> list:
        raise AssertionError("simulated")

    return Scheduler(
        Settings.from_env({}, **settings),
        FakeRunnerFactory(latency=0.002),
        DeviceSource(no_discovery, environ=env),
        read_info=lambda p: model(int(p.stem)),
    )


async def placement_times() -> tuple[float, float]:
    gpus = [GpuSlot(f"GPU-{g}", "CUDA", (24 - g) * GiB, g >= 6) for g in range(8)]
    pure = []
    for i in range(50):
        est = estimate(model(i), EstimateOptions(num_ctx=4096))
        start = time.perf_counter()
        plan_layout(est, gpus, 256 * GiB, require_full=True)
        pure.append(time.perf_counter() - start)

    s = scheduler(8, max_loaded_models=64, keep_alive=-1)
    full = []
    for i in range(50):
        start = time.perf_counter()
        lease = await s.acquire(entry(i), LoadOptions(num_ctx=2048), None)
        full.append(time.perf_counter() - start)
        lease.release()
    loaded = len(s.loaded_models())
    await s.shutdown()
    print(f"models loaded at the end: {loaded} of 50")
    return statistics.median(pure), statistics.median(full)


async def overload(n_requests: int = 1000, max_queue: int = 64) -> tuple[int, int, int]:
    s = scheduler(2, max_queue=max_queue, max_loaded_models=5)
    ok = busy = 0

    async def request(i: int) -> None:
        nonlocal ok, busy
        try:
            async with s.use(entry(i % 5), LoadOptions(num_ctx=2048), None) as lease:
                async for _ in lease.runner.complete(Complete(prompt="x")):
                    pass
            ok += 1
        except ServerBusy:
            busy += 1

    await asyncio.wait_for(asyncio.gather(*(request(i) for i in range(n_requests))), 60)
    await s.shutdown()
    return ok, busy, n_requests - max_queue


async def main() -> int:
    pure, full = await placement_times()
    print(f"placement, pure layout (8 GPUs)     : median {pure * 1e3:.3f} ms")
    print(f"placement, acquire with fake runner : median {full * 1e3:.3f} ms")
    ok, busy, expected_busy = await overload()
    print(
        f"1000 concurrent requests, 5 models, max_queue 64: {ok} completed, {busy} got 503"
        f" (expected {expected_busy}), 0 hung"
    )
    met = full < 1e-3 and pure < 1e-3 and busy == expected_busy and ok + busy == 1000
    print("targets (< 1 ms, exact overflow):", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
