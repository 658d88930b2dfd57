"""A scheduler over fake runners and simulated devices, for the tests that
drive one: models by name with synthetic facts, device environments, and
``use`` for one lease."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fakes import FakeRunnerFactory, simulated_environ, synthetic_model

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceSource
from jupyter_llm.memory import ModelInfo
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.scheduler import LoadOptions, Scheduler

MiB, GiB = 1 << 20, 1 << 30


def info(layer_mib: int = 200, n_layer: int = 32) -> ModelInfo:
    return synthetic_model(layer_mib, n_layer)


INFOS: dict[str, ModelInfo] = {}


def entry(name: str, model: ModelInfo | None = None) -> ModelEntry:
    path = Path(f"/models/{name}.gguf")
    INFOS[str(path)] = model or info()
    return ModelEntry(
        name=parse_model_name(name),
        digest=f"d-{name}",
        size=1,
        modified_at=datetime.now(UTC),
        model_path=path,
        template=None,
        system=None,
        config={},
    )


Factory = FakeRunnerFactory


def simulated(gpus: list[tuple[str, int, bool]], system: int = 64 * GiB) -> dict[str, str]:
    return simulated_environ(gpus, system)


async def no_discovery():
    raise AssertionError("simulated devices need no discovery")


def make(env, factory=None, **settings) -> tuple[Scheduler, Factory]:
    factory = factory or Factory()
    s = Settings.from_env({}, **{"keep_alive": 300.0, "num_parallel": 1, **settings})
    devices = DeviceSource(no_discovery, environ=env)
    return Scheduler(s, factory, devices, read_info=lambda p: INFOS[str(p)]), factory


async def use(scheduler, e, keep_alive=None, **options):
    async with scheduler.use(e, LoadOptions(**options), keep_alive) as lease:
        return lease.loaded


ONE_GPU = simulated([("gpu0", 24 * GiB, False)])
