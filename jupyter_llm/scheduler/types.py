"""The scheduler's vocabulary: what it needs of a runner and of its factory,
the load options of a request, a loaded model's record, and a request's lease."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from jupyter_llm.memory import Allocation, Placement
from jupyter_llm.models.store import ModelEntry
from jupyter_llm.request.errors import RunnerFailed
from jupyter_llm.runner.protocol import Complete, Embed
from jupyter_llm.runner_client.decode_threads import DecodeThreads
from jupyter_llm.runner_client.launch import LoadRequest
from jupyter_llm.scheduler.fair_queue import Waiter


class Runner(Protocol):
    """What the scheduler needs of a loaded runner (``runner_client.proxy.RunnerProxy``)."""

    load_duration_ns: int
    threads: DecodeThreads  # the CPU threads it decodes with (``/api/ps``)

    @property
    def alive(self) -> bool: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_seq(self) -> int: ...  # sequences it decodes at once: the model's slots
    @property
    def measured(self) -> dict[str, dict[str, int]]: ...  # what it holds now, as it said
    @property
    def measured_at_load(self) -> dict[str, dict[str, int]]: ...  # what its load allocated
    @property
    def kv_cache_fallback(self) -> str: ...  # why the runner made its KV cache f16 ("" if not)
    def complete(self, request: Complete) -> AsyncIterator[list[dict[str, Any]]]: ...
    async def embed(self, request: Embed) -> dict[str, Any]: ...
    async def health(self, timeout: float = 5.0) -> bool: ...
    async def device_info(self) -> list[dict[str, Any]]: ...
    # ``reason``: what the requests still running end with (default: the runner's exit)
    async def close(self, reason: RunnerFailed | None = None) -> None: ...
    def kill(self) -> None: ...


# Takes each fraction (0..1) of a model's load as its runner reports it.
ProgressReport = Callable[[float], None]

# Starts a runner and loads the model into it, passing the load's progress to
# the report; raises ``ModelLoadFailed`` (``AllocationFailed`` when llama.cpp
# could not get the memory).
RunnerFactory = Callable[[LoadRequest, ProgressReport], Awaitable[Runner]]


@dataclass(frozen=True)
class LoadOptions:
    """Load-time options of one request (None: the server's default)."""

    num_ctx: int | None = None
    num_batch: int | None = None
    num_thread: int | None = None
    use_mmap: bool | None = None
    num_gpu: int | None = None


@dataclass(frozen=True)
class Wanted:
    """Load options resolved against the settings and the model."""

    num_ctx: int
    num_batch: int
    num_thread: int
    use_mmap: bool
    num_gpu: int
    flash_attn: str = "auto"  # the server's setting (``Settings.flash_attention``)
    kv_cache_type: str = "f16"  # the type this load gets (memory.kv_cache.choose_kv_type)
    kv_cache_fallback: str = ""  # why it is f16 though the setting asks for another
    batch_invariant: bool = False  # memory.kv_cache.choose_batch_invariant
    batch_invariant_fallback: str = ""  # why not, though the setting asks for it


@dataclass
class Loaded:
    """A loaded model and its bookkeeping."""

    entry: ModelEntry
    runner: Runner
    wanted: Wanted
    placement: Placement
    allocations: tuple[Allocation, ...]
    measured: bool
    keep_alive: float
    parallel: int = 1  # requests it serves at once (the number of slots)
    refcount: int = 0  # slots taken (requests running on it)
    users: Counter[str] = field(default_factory=Counter)  # running requests per user
    by_priority: Counter[str] = field(default_factory=Counter)  # running, per priority
    admitted: dict[Waiter, float] = field(default_factory=dict)  # running: when each got its slot
    node: str = ""  # the cluster node it runs on ("": this machine)
    # the runner's buffer names -> device ids ("CUDA0" -> a GPU), where ``measured``
    buffer_names: dict[str, str] = field(default_factory=dict)
    waiting: int = 0
    drainers: int = 0  # loads waiting (without the load lock) for its requests to end
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # wall clock, while idle
    timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> str:
        return self.entry.name.display

    @property
    def draining(self) -> bool:
        """An eviction or reload waits for it: new requests wait too, so the
        drain ends."""
        return self.drainers > 0


class Request(NamedTuple):
    """One request on a model as ``/api/ps`` lists it: ``state`` is
    "running" or "queued", ``since`` when it got its slot or was queued
    (wall clock). Never its prompt."""

    state: str
    user: str
    priority: str
    since: float


class MustDrain(Exception):
    """The plan needs ``victim`` gone, but it is busy: wait without the load
    lock until its requests end, then plan again."""

    def __init__(self, victim: Loaded) -> None:
        super().__init__(victim.key)
        self.victim = victim


class Unloaded(Exception):
    """The model a request was queued on went away (an admin's unload, an
    eviction, a dead runner) before a slot came: it goes back to loading."""


class Lease:
    """A request's hold on a loaded runner; released however the request ends."""

    def __init__(
        self,
        loaded: Loaded,
        load_duration_ns: int,
        user: str,
        on_release: Callable[[Loaded, str, str], None],
        priority: str = "interactive",
    ) -> None:
        self.loaded = loaded
        self.user = user
        self.priority = priority
        self.runner = loaded.runner
        self.load_duration_ns = load_duration_ns
        self._on_release = on_release
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._on_release(self.loaded, self.user, self.priority)
