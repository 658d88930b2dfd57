"""From a placement to a runner's launch: load parameters and device visibility.

The scheduler decides *where* a model goes (a ``LoadRequest`` in its own terms:
device ids, layers per GPU); this module knows how a runner is told so: the
``LoadSpec``: the ``load`` message it receives (``protocol.LoadParams``: layers
to offload, tensor split, context size) and the environment that makes only the
chosen GPUs visible to its backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from jupyter_llm.devices import DeviceInfo
from jupyter_llm.memory import Placement
from jupyter_llm.memory.kv_cache import key_type
from jupyter_llm.runner.protocol import LoadParams

VISIBILITY_ENV = {
    "CUDA": "CUDA_VISIBLE_DEVICES",
    "ROCm": "HIP_VISIBLE_DEVICES",
    "Vulkan": "GGML_VK_VISIBLE_DEVICES",
}


# a batch-invariant runner's ggml: no tiled K-quant matmul, which ggml takes
# from 8 rows and which adds in another order than the per-row product
INVARIANT_ENV = (("GGML_CPU_TILED_MM", "0"),)


@dataclass(frozen=True)
class LoadRequest:
    """What the scheduler decided for one load (``num_ctx`` is per sequence)."""

    path: str
    num_ctx: int
    num_batch: int
    num_thread: int
    use_mmap: bool
    parallel: int
    placement: Placement
    gpus: tuple[DeviceInfo, ...] = ()  # the serving GPUs, in the order the layout saw them
    simulated: bool = False  # simulated GPUs: the runner computes on the CPU
    projector: str = ""  # the vision projector GGUF ("" = none)
    draft: str = ""  # the draft model's GGUF, same vocabulary ("" = none)
    node: str = ""  # the cluster node it loads on ("": this machine)
    flash_attn: str = "auto"  # "auto", "on" or "off" (``Settings.flash_attention``)
    kv_cache_type: str = "f16"  # the type chosen for this load (memory.kv_cache)
    batch_invariant: bool = False  # memory.kv_cache.choose_batch_invariant


@dataclass(frozen=True)
class LoadSpec(LoadParams):
    """A runner's launch: its ``load`` message and the environment it starts in."""

    # the runner's environment: device visibility, the batch-invariant ggml switch
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def load_params(self) -> LoadParams:
        """The ``load`` message: every field but the environment."""
        names = {f.name for f in fields(LoadParams)}
        return LoadParams(**{k: v for k, v in self.__dict__.items() if k in names})


def gpu_library(request: LoadRequest) -> str:
    """The backend the runner uses for this load ("" for the CPU only)."""
    return request.gpus[0].library if request.gpus and request.placement.gpus else ""


def launch_spec(request: LoadRequest, environ: Mapping[str, str]) -> LoadSpec:
    """The runner's load parameters: ``parallel`` sequences share one unified
    KV cache of ``num_ctx`` cells (memory does not grow with ``parallel``)."""
    base = LoadSpec(
        path=request.path,
        n_ctx=request.num_ctx,
        n_seq=request.parallel,
        n_batch=request.num_batch,
        n_threads=request.num_thread,
        use_mmap=request.use_mmap,
        projector=request.projector,
        draft=request.draft,
        flash_attn=request.flash_attn,
        kv_cache_type=request.kv_cache_type,
        batch_invariant=request.batch_invariant,
        env=INVARIANT_ENV if request.batch_invariant else (),
    )
    placement = request.placement
    if request.simulated:
        return base
    if not placement.gpus:
        return replace(base, env=base.env + hidden_gpus_env(request.gpus))
    index = {d.id: i for i, d in enumerate(request.gpus)}
    used = [index[g] for g in placement.gpus]
    return replace(
        base,
        n_gpu_layers=placement.n_gpu_layers,
        tensor_split=tuple(placement.tensor_split) if len(used) > 1 else (),
        main_gpu=0,
        env=base.env + visibility_env(gpu_library(request), used, environ),
    )


@dataclass(frozen=True)
class PromptDisk:
    """The prompt cache on disk as the server configures it (``Settings.prompt_disk_*``)."""

    dir: str
    max_bytes: int
    expiry: float


BLOB_NAME = re.compile(r"sha256-([0-9a-f]{64})")  # the store's blobs (ModelStore.blob_path)


def prompt_disk_spec(request: LoadRequest, disk: PromptDisk | None) -> dict[str, Any]:
    """``LoadParams.prompt_disk`` for this load: the model's key is its GGUF
    blob's sha256 (the store verified it) with the KV cache's type and flash
    attention, which fix the state's layout. Off ({}) where it is off, or
    for a file outside the store (no digest to key it by)."""
    blob = BLOB_NAME.fullmatch(Path(request.path).name)
    if disk is None or disk.max_bytes <= 0 or blob is None:
        return {}
    kv = request.kv_cache_type
    if (keys := key_type(kv, request.batch_invariant)) != kv:
        kv = f"{keys}-{kv}"  # the keys' type, then the values'
    model = f"sha256:{blob.group(1)}|{kv}|fa-{request.flash_attn}"
    if request.batch_invariant:  # other kernels wrote the states: never mixed
        model += "|batch-invariant"
    return {"dir": disk.dir, "model": model, "max_bytes": disk.max_bytes, "expiry": disk.expiry}


def prompt_ram_spec(max_bytes: int) -> dict[str, Any]:
    """``LoadParams.prompt_ram`` for a load: the runner's byte budget ({}: off)."""
    return {"max_bytes": max_bytes} if max_bytes > 0 else {}


def hidden_gpus_env(gpus: Sequence[DeviceInfo]) -> tuple[tuple[str, str], ...]:
    """Hide every GPU from a runner placed on the CPU alone: a visible GPU still
    takes llama.cpp's large matrix products (and a compute buffer the plan does
    not hold) even with no layer offloaded."""
    libraries = sorted({g.library for g in gpus if g.library in VISIBILITY_ENV})
    return tuple((VISIBILITY_ENV[library], "") for library in libraries)


def visibility_env(
    library: str, indices: list[int], parent: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """Make only the chosen GPUs visible to the runner, respecting an existing
    restriction (index i of the runner's devices is the i-th visible one)."""
    var = VISIBILITY_ENV.get(library)
    if var is None or not indices:
        return ()
    if visible := parent.get(var):
        allowed = [v.strip() for v in visible.split(",")]
        chosen = [allowed[i] for i in indices if i < len(allowed)]
    else:
        chosen = [str(i) for i in indices]
    return ((var, ",".join(chosen)),)
