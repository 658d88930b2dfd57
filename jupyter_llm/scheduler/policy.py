"""The scheduler's decisions, as plain functions over plain data: which model
to evict, whether a loaded one serves a request, where a model goes, what a
load asks of the runner factory. The state machine (``scheduler.py``) acts
on them; tests read them as tables."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceInfo, node_devices, nodes_by_free, on_node, serving_gpus
from jupyter_llm.memory import (
    CPU,
    Allocation,
    Estimate,
    GpuSlot,
    LayoutFailure,
    ModelInfo,
    Placement,
    plan_layout,
)
from jupyter_llm.memory.kv_cache import choose_batch_invariant, choose_kv_type
from jupyter_llm.memory.measured import grown, measured_allocations, with_growth
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.runner_client.launch import LoadRequest
from jupyter_llm.scheduler.types import Loaded, LoadOptions, Wanted

log = logging.getLogger(__name__)

MAX_BACKOFF_STEPS = 9  # new estimates: 10 %, 20 %, ... 90 % less free memory
VRAM_RECOVERY_SHARE = 0.75


def choose_victim(loaded: list[Loaded]) -> Loaded | None:
    """Idle runners first; then the shortest keep_alive, then least recently used.
    With none idle, the best busy one (the caller waits for it to drain)."""
    if not loaded:
        return None
    idle = [m for m in loaded if m.refcount == 0]
    return min(idle or loaded, key=lambda m: (m.keep_alive, m.last_used))


def needs_reload(loaded: Loaded, entry: ModelEntry, wanted: Wanted) -> bool:
    """A different file, or a load-time option that differs. A smaller or equal
    num_ctx reuses the runner; num_gpu -1 accepts any layout. The options that
    tune speed only (num_batch, num_thread, use_mmap) reload an idle model, not
    one that requests run on: the request runs on it as loaded (one user's
    num_batch 511, then 510, reloaded a shared model for everyone each time).
    (``main_gpu`` is accepted and not kept: the layout chooses the GPUs, and
    it let any user reload a shared model by alternating it.)"""
    have = loaded.wanted
    tuned = (
        wanted.num_batch != have.num_batch
        or wanted.num_thread != have.num_thread
        or wanted.use_mmap != have.use_mmap
    )
    return (
        loaded.entry.digest != entry.digest
        or wanted.num_ctx > have.num_ctx
        or (wanted.num_gpu != -1 and wanted.num_gpu != have.num_gpu)
        or (tuned and loaded.refcount == 0)
    )


def eviction_node(
    devices: list[DeviceInfo], loaded: list[Loaded], fits: Callable[[str], bool]
) -> str:
    """Where to make room when the model fits on no node as things are: the
    first node (most free memory first) where it would fit with that node's
    models gone (``fits``), else the first node with a model at all. Evicting
    only there, a model on one node never goes to make room on another."""
    busy = [n for n in nodes_by_free(devices) if any(m.node == n for m in loaded)]
    return next((n for n in busy if fits(n)), busy[0] if busy else "")


def max_loaded(settings: Settings, gpu_count: int) -> int:
    return settings.max_loaded_models or max(3, 3 * gpu_count)


def wanted(options: LoadOptions, info: ModelInfo, settings: Settings) -> Wanted:
    """A request's load options, the server's defaults filled in; num_ctx is
    capped at the model's trained context and num_batch at num_ctx."""
    num_ctx = options.num_ctx or settings.context_length
    if info.context_length:
        num_ctx = min(num_ctx, info.context_length)
    return Wanted(
        num_ctx=num_ctx,
        num_batch=min(options.num_batch or 512, num_ctx),
        num_thread=options.num_thread or settings.num_threads,
        use_mmap=True if options.use_mmap is None else options.use_mmap,
        num_gpu=-1 if options.num_gpu is None else options.num_gpu,
        flash_attn=settings.flash_attention,
        **kv_cache_fields(settings, info),
    )


def kv_cache_fields(settings: Settings, info: ModelInfo) -> dict[str, Any]:
    """The cache type this model gets, and whether it is batch-invariant; a
    fallback is logged once per model."""
    choice = choose_kv_type(settings.kv_cache_type, settings.flash_attention, info)
    if choice.fallback and (info.architecture, choice.fallback) not in _WARNED:
        _WARNED.add((info.architecture, choice.fallback))
        log.warning("KV cache f16 instead of %s: %s", settings.kv_cache_type, choice.fallback)
    invariant, why_not = choose_batch_invariant(
        settings.batch_invariant, choice, settings.flash_attention, info
    )
    if why_not and (info.architecture, why_not) not in _WARNED:
        _WARNED.add((info.architecture, why_not))
        log.warning("not batch-invariant: %s", why_not)
    return {
        "kv_cache_type": choice.kv_type,
        "kv_cache_fallback": choice.fallback,
        "batch_invariant": invariant,
        "batch_invariant_fallback": why_not,
    }


_WARNED: set[tuple[str, str]] = set()  # (architecture, reason) already logged


def invariant_where_placed(wanted: Wanted, placement: Placement, simulated: bool) -> Wanted:
    """``wanted`` as /api/ps reports it once placed: the batch-invariant
    loading holds for llama.cpp's CPU kernels; a GPU backend's own kernels
    (layers on real GPUs) are not known to be invariant."""
    if not wanted.batch_invariant or simulated or not placement.n_gpu_layers:
        return wanted
    why = f"{placement.n_gpu_layers} layers on GPUs, whose kernels it does not cover"
    return replace(wanted, batch_invariant=False, batch_invariant_fallback=why)


def parallel_slots(info: ModelInfo, settings: Settings) -> int:
    """Requests a runner serves at once: an embedding model one."""
    return 1 if info.embedding_only else settings.num_parallel


def held_allocations(loaded: Loaded) -> tuple[Allocation, ...]:
    """What ``loaded`` holds per device now: its load (measured, or the
    layout's estimate) and what its runner made since (an embedding
    context, prompts kept in RAM), as the runner said at a request's end."""
    runner = loaded.runner
    if loaded.measured:
        now = measured_allocations(loaded.placement, runner.measured, loaded.buffer_names)
        return now or loaded.allocations
    growth = grown(runner.measured, runner.measured_at_load)
    return with_growth(loaded.placement.allocations, growth, loaded.buffer_names)


def held_bytes(loaded: Iterable[Loaded]) -> dict[str, int]:
    """Bytes the models hold per device, keyed across nodes (``on_node``)."""
    held: dict[str, int] = {}
    for m in loaded:
        for a in m.allocations:
            key = on_node(m.node, a.device)  # a node's own "cpu", and its GPUs
            held[key] = held.get(key, 0) + a.total
    return held


def with_freed(devices: list[DeviceInfo], gone: Iterable[Loaded]) -> list[DeviceInfo]:
    """``devices`` as they would be with the ``gone`` models unloaded."""
    held = held_bytes(gone)
    return [
        replace(d, free_memory=d.free_memory + held.get(on_node(d.node, d.id), 0)) for d in devices
    ]


def gpu_slots(devices: list[DeviceInfo], backoff: int) -> list[GpuSlot]:
    """The serving GPUs, free memory shrunk by the backoff."""
    keep = 1.0 - 0.1 * backoff
    return [
        GpuSlot(d.id, d.library, int(d.free_memory * keep), d.integrated)
        for d in serving_gpus(devices)
    ]


def plan_on_node(
    est: Estimate,
    wanted: Wanted,
    devices: list[DeviceInfo],
    backoff: int,
    others: bool,
    gpu_overhead: int,
) -> Placement:
    """The layout on one node's devices; with other models there, all on GPUs."""
    return plan_layout(
        est,
        gpu_slots(devices, backoff),
        next(d.free_memory for d in devices if not d.is_gpu),
        num_gpu=wanted.num_gpu,
        require_full=others,
        gpu_overhead=gpu_overhead,
    )


def place(
    est: Estimate,
    wanted: Wanted,
    devices: list[DeviceInfo],
    backoff: int,
    loaded: list[Loaded],
    gpu_overhead: int,
) -> tuple[str, Placement]:
    """The first node (most free memory first) with a layout; one model
    never spans nodes. Raises the first node's ``LayoutFailure``."""
    first: LayoutFailure | None = None
    for node in nodes_by_free(devices):
        others = any(m.node == node for m in loaded)
        try:
            on = node_devices(devices, node)
            return node, plan_on_node(est, wanted, on, backoff, others, gpu_overhead)
        except LayoutFailure as failure:
            first = first or failure
    raise first or LayoutFailure("no node to place the model on")


def fits_emptied(
    est: Estimate,
    wanted: Wanted,
    devices: list[DeviceInfo],
    node: str,
    loaded: list[Loaded],
    gpu_overhead: int,
) -> bool:
    """Would the model fit on ``node`` with its models unloaded?"""
    freed = node_devices(with_freed(devices, [m for m in loaded if m.node == node]), node)
    try:
        plan_on_node(est, wanted, freed, 0, False, gpu_overhead)
    except LayoutFailure:
        return False
    return True


def may_back_off(placement: Placement, backoff: int) -> bool:
    """After an allocation failure: retry with less free memory assumed, while
    some layers were on GPUs and the steps are not used up."""
    return placement.n_gpu_layers > 0 and backoff < MAX_BACKOFF_STEPS


def load_request(
    entry: ModelEntry,
    wanted: Wanted,
    parallel: int,
    placement: Placement,
    devices: list[DeviceInfo],
    simulated: bool,
    node: str = "",
) -> LoadRequest:
    """What the runner factory is asked to load, on ``node``'s ``devices``."""
    return LoadRequest(
        path=str(entry.model_path),
        num_ctx=wanted.num_ctx,
        num_batch=wanted.num_batch,
        num_thread=wanted.num_thread,
        use_mmap=wanted.use_mmap,
        parallel=parallel,
        placement=placement,
        gpus=tuple(serving_gpus(devices)),
        simulated=simulated,
        projector=str(entry.projector_path or ""),
        draft=str(entry.draft_path or ""),
        node=node,
        flash_attn=wanted.flash_attn,
        kv_cache_type=wanted.kv_cache_type,
        batch_invariant=wanted.batch_invariant,
    )


def vram_held(loaded: Loaded) -> dict[str, int]:
    """The bytes ``loaded`` holds on each GPU (what its unload gives back)."""
    return {a.device: a.total for a in loaded.allocations if a.device != CPU and a.total}


def vram_to_watch(held: Mapping[str, int], devices: list[DeviceInfo]) -> dict[str, int]:
    """The discrete GPUs among ``held`` (shared memory comes back at once)."""
    by_id = {d.id: d for d in devices}
    return {d: n for d, n in held.items() if d in by_id and not by_id[d].integrated}


def vram_recovered(
    before: Mapping[str, int], now: Mapping[str, int], held: Mapping[str, int]
) -> bool:
    """Each GPU has ``VRAM_RECOVERY_SHARE`` of what was held free again."""
    return all(now.get(d, 0) - before.get(d, 0) >= VRAM_RECOVERY_SHARE * n for d, n in held.items())
