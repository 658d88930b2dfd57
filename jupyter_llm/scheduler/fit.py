"""The fit loop's one decision, and the plan that repeats it without acting.

The scheduler's load loop asks ``next_move`` what to do with the devices and
models as they are now: place the model, or evict one model first. ``plan_load``
asks the same question on a copy of that state, evicting only on paper, so
``POST /api/plan`` tells what a load would do with the very rules that load
follows. Pure: the caller reads the devices and the GGUF facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceInfo, gpu_max_tensor, node_devices, serving_gpus
from jupyter_llm.memory import (
    Allocation,
    Estimate,
    EstimateOptions,
    LayoutFailure,
    ModelInfo,
    Placement,
    estimate,
)
from jupyter_llm.memory.kv_cache import key_type
from jupyter_llm.memory.projector import ProjectorInfo
from jupyter_llm.scheduler import policy
from jupyter_llm.scheduler.types import Loaded, Wanted


@dataclass(frozen=True)
class Place:
    """Load it here now."""

    node: str
    placement: Placement


@dataclass(frozen=True)
class Evict:
    """Unload ``victim`` first (waiting for its requests if it is busy)."""

    victim: Loaded


def estimate_on(
    info: ModelInfo,
    wanted: Wanted,
    devices: list[DeviceInfo],
    projector: ProjectorInfo | None,
    draft: ModelInfo | None = None,
    *,
    parallel: int,
) -> Estimate:
    """The model's memory with these options (and its draft model's, with the
    same) for a runner serving ``parallel`` requests at once (its sequence
    ids and its rows of logits grow with it); what the serving GPUs' backend
    refuses (a tensor past its limit) is counted on the CPU."""
    limit = gpu_max_tensor(serving_gpus(devices))
    opts = EstimateOptions(
        num_ctx=wanted.num_ctx,
        num_batch=wanted.num_batch,
        num_parallel=parallel,
        kv_type=wanted.kv_cache_type,
        kv_type_k=key_type(wanted.kv_cache_type, wanted.batch_invariant),
        gpu_max_tensor=limit,
    )
    return estimate(info, opts, projector, draft)


def next_move(
    est: Estimate,
    wanted: Wanted,
    devices: list[DeviceInfo],
    loaded: list[Loaded],
    settings: Settings,
    backoff: int = 0,
) -> Place | Evict:
    """Keep below ``max_loaded_models``; then place the model, or evict a model
    on the node where emptying it would help (``policy.eviction_node``).
    Raises the ``LayoutFailure`` when no eviction would help."""
    gpus = sum(1 for d in devices if d.is_gpu)
    if len(loaded) >= policy.max_loaded(settings, gpus) and (
        victim := policy.choose_victim(loaded)
    ):
        return Evict(victim)
    overhead = settings.gpu_overhead
    try:
        return Place(*policy.place(est, wanted, devices, backoff, loaded, overhead))
    except LayoutFailure:
        where = policy.eviction_node(
            devices,
            loaded,
            lambda n: policy.fits_emptied(est, wanted, devices, n, loaded, overhead),
        )
        if (victim := policy.choose_victim([m for m in loaded if m.node == where])) is None:
            raise
        return Evict(victim)


@dataclass(frozen=True)
class LoadPlan:
    """What a request would do now. ``placement`` None: it fits nowhere, and
    ``reason`` says why. ``devices``: as the load would see them, after the
    evictions. ``loaded``: already loaded as wanted, so it is reused as it is."""

    wanted: Wanted
    parallel: int
    placement: Placement | None
    allocations: tuple[Allocation, ...] = ()
    node: str = ""
    evicts: tuple[Loaded, ...] = ()
    devices: tuple[DeviceInfo, ...] = ()
    reason: str = ""
    loaded: bool = False

    @property
    def fits(self) -> bool:
        return self.placement is not None


def plan_load(
    est: Estimate,
    wanted: Wanted,
    parallel: int,
    devices: list[DeviceInfo],
    loaded: list[Loaded],
    settings: Settings,
    replaced: Loaded | None = None,
) -> LoadPlan:
    """``next_move`` until it places the model, each eviction done on paper
    (its memory given back to its devices). ``replaced``: the model's own
    runner, loaded with other options, which the load unloads first."""
    evicted = []
    if replaced is not None:
        devices, loaded = without(replaced, devices, loaded)
        evicted.append(replaced)
    for _ in range(len(loaded) + 1):  # each turn evicts one model, or ends
        try:
            move = next_move(est, wanted, devices, loaded, settings)
        except LayoutFailure as failure:
            # the scheduler does evict these before it gives up
            gone, shown = tuple(evicted), tuple(devices)
            return LoadPlan(wanted, parallel, None, evicts=gone, devices=shown, reason=str(failure))
        if isinstance(move, Place):
            on = tuple(node_devices(devices, move.node))
            allocations = move.placement.allocations
            return LoadPlan(
                wanted, parallel, move.placement, allocations, move.node, tuple(evicted), on
            )
        devices, loaded = without(move.victim, devices, loaded)
        evicted.append(move.victim)
    raise AssertionError("unreachable: nothing left to evict")


def reuse_plan(current: Loaded, devices: list[DeviceInfo]) -> LoadPlan:
    """The model is loaded as wanted: a request uses it as it is."""
    return LoadPlan(
        current.wanted,
        current.parallel,
        current.placement,
        current.allocations,
        current.node,
        devices=tuple(node_devices(devices, current.node)),
        loaded=True,
    )


def without(
    victim: Loaded, devices: list[DeviceInfo], loaded: list[Loaded]
) -> tuple[list[DeviceInfo], list[Loaded]]:
    """The state after ``victim``'s unload: its bytes free again."""
    return policy.with_freed(devices, [victim]), [m for m in loaded if m is not victim]
