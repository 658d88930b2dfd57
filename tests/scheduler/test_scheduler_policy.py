"""The scheduler's decisions as tables: plain functions over plain data
(``jupyter_llm.scheduler.policy``), and its small collaborators."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from scheduler_env import GiB, entry, info

from jupyter_llm.config import Settings
from jupyter_llm.devices import DeviceInfo, on_node
from jupyter_llm.memory import Allocation, EstimateOptions, LayoutFailure, Placement, estimate
from jupyter_llm.scheduler import Loaded, LoadOptions, Wanted, max_loaded, needs_reload, policy
from jupyter_llm.scheduler.load_progress import LoadProgress
from jupyter_llm.scheduler.model_facts import ModelFacts
from jupyter_llm.scheduler.slots import SlotGrants
from jupyter_llm.scheduler.types import Unloaded

WANTED = Wanted(num_ctx=4096, num_batch=512, num_thread=0, use_mmap=True, num_gpu=-1)
NO_PLACEMENT = Placement(gpu_layers=(), allocations=(), n_gpu_layers=0, n_layers=33)


def loaded(
    name: str = "a",
    *,
    wanted: Wanted = WANTED,
    node: str = "",
    allocations: tuple[Allocation, ...] = (),
) -> Loaded:
    return Loaded(
        entry=entry(name),
        runner=None,
        wanted=wanted,
        placement=NO_PLACEMENT,
        allocations=allocations,
        measured=False,
        keep_alive=300.0,
        node=node,
    )


def gpu(id: str, free_gib: float, node: str = "", integrated: bool = False) -> DeviceInfo:
    size = int(free_gib * GiB)
    library = "Vulkan" if integrated else "CUDA"
    return DeviceInfo(id=on_node(node, id), library=library, name=id, total_memory=size,
                      free_memory=size, integrated=integrated, node=node)  # fmt: skip


def cpu(free_gib: float = 64, node: str = "") -> DeviceInfo:
    size = int(free_gib * GiB)
    return DeviceInfo(id=on_node(node, "cpu"), library="CPU", name="CPU",
                      total_memory=size, free_memory=size, node=node)  # fmt: skip


def held(device: str, gib: float) -> Allocation:
    return Allocation(device, int(gib * GiB), 0, 0)


@pytest.mark.parametrize(
    ("change", "reload"),
    [
        ({}, False),
        ({"num_ctx": 2048}, False),  # smaller context: the runner serves it
        ({"num_ctx": 8192}, True),
        ({"num_batch": 256}, True),
        ({"num_thread": 4}, True),
        ({"use_mmap": False}, True),
        ({"num_gpu": 10}, True),
    ],
)
def test_needs_reload(change, reload):
    assert needs_reload(loaded(), entry("a"), replace(WANTED, **change)) is reload


@pytest.mark.parametrize(
    ("change", "reload"),
    [
        ({"num_batch": 256}, False),  # speed only: it runs on the model as loaded
        ({"num_thread": 4}, False),
        ({"use_mmap": False}, False),
        ({"num_ctx": 8192}, True),  # what the model can do: a reload, once it drains
        ({"num_gpu": 10}, True),
    ],
)
def test_needs_reload_while_requests_run_on_it(change, reload):
    busy = loaded()
    busy.refcount = 1
    assert needs_reload(busy, entry("a"), replace(WANTED, **change)) is reload


def test_needs_reload_for_another_file():
    other = replace(entry("a"), digest="d-other")
    assert needs_reload(loaded(), other, WANTED)


def test_any_layout_serves_num_gpu_minus_one():
    assert not needs_reload(loaded(wanted=replace(WANTED, num_gpu=12)), entry("a"), WANTED)


@pytest.mark.parametrize(
    ("setting", "gpus", "expected"), [(0, 0, 3), (0, 1, 3), (0, 2, 6), (0, 4, 12), (5, 4, 5)]
)
def test_max_loaded(setting, gpus, expected):
    assert max_loaded(Settings.from_env({}, max_loaded_models=setting), gpus) == expected


@pytest.mark.parametrize(
    ("options", "trained", "expected"),
    [
        (LoadOptions(), 32768, WANTED),
        (LoadOptions(num_ctx=65536), 32768, replace(WANTED, num_ctx=32768)),  # the model's cap
        (LoadOptions(num_ctx=256), 32768, replace(WANTED, num_ctx=256, num_batch=256)),
        (LoadOptions(num_ctx=8192), 0, replace(WANTED, num_ctx=8192)),  # no trained length
        (LoadOptions(num_gpu=0, use_mmap=False, num_thread=3, num_batch=64), 32768,
         replace(WANTED, num_gpu=0, use_mmap=False, num_thread=3, num_batch=64)),
    ],
)  # fmt: skip
def test_wanted(options, trained, expected):
    model = replace(info(), context_length=trained)
    assert policy.wanted(options, model, Settings.from_env({}, context_length=4096)) == expected


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ([], {}),
        ([loaded(allocations=(held("gpu0", 2), held("cpu", 1)))], {"gpu0": 2 * GiB, "cpu": GiB}),
        ([loaded("a", allocations=(held("gpu0", 2),)), loaded("b", allocations=(held("gpu0", 3),))],
         {"gpu0": 5 * GiB}),
        ([loaded(node="n1", allocations=(held("cpu", 1), held("n1/gpu0", 2)))],
         {"n1/cpu": GiB, "n1/gpu0": 2 * GiB}),
    ],
)  # fmt: skip
def test_held_bytes(models, expected):
    assert policy.held_bytes(models) == expected


@pytest.mark.parametrize(("backoff", "free"), [(0, 10 * GiB), (1, 9 * GiB), (5, 5 * GiB)])
def test_gpu_slots_shrink_with_the_backoff(backoff, free):
    slots = policy.gpu_slots([gpu("gpu0", 10), cpu()], backoff)
    assert [(s.id, s.free) for s in slots] == [("gpu0", pytest.approx(free, abs=1))]


@pytest.mark.parametrize(
    ("n_gpu_layers", "backoff", "again"),
    [(33, 0, True), (33, 8, True), (33, 9, False), (0, 0, False)],
)
def test_may_back_off(n_gpu_layers, backoff, again):
    placement = replace(NO_PLACEMENT, n_gpu_layers=n_gpu_layers)
    assert policy.may_back_off(placement, backoff) is again


EST = estimate(info(), EstimateOptions(num_ctx=4096, num_batch=512))  # about 7 GiB


@pytest.mark.parametrize(
    ("devices", "others", "node", "gpus"),
    [
        ([gpu("gpu0", 24), cpu()], [], "", ["gpu0"]),
        ([gpu("gpu0", 4, "a"), cpu(node="a"), gpu("gpu0", 24, "b"), cpu(node="b")], [], "b",
         ["b/gpu0"]),  # the node with the most free memory
        ([gpu("gpu0", 12, "a"), cpu(node="a"), gpu("gpu0", 9, "b"), cpu(node="b")],
         [loaded(node="a")], "a", ["a/gpu0"]),  # all on a GPU beside another model
    ],
)  # fmt: skip
def test_place(devices, others, node, gpus):
    where, placement = policy.place(EST, WANTED, devices, 0, others, 0)
    assert (where, placement.gpus) == (node, gpus)


def test_place_raises_the_first_nodes_failure():
    with pytest.raises(LayoutFailure, match="system memory"):
        policy.place(EST, WANTED, [cpu(2, "a"), cpu(1, "b")], 0, [], 0)


@pytest.mark.parametrize(
    ("free_gib", "held_gib", "fits"), [(2, 6, True), (2, 1, False), (9, 0, True)]
)
def test_fits_emptied(free_gib, held_gib, fits):
    """With a model holding ``held_gib`` of the GPU gone, would ~7 GiB fit?"""
    devices = [gpu("gpu0", free_gib, "n"), cpu(1, "n")]
    others = [loaded(node="n", allocations=(held("n/gpu0", held_gib),))] if held_gib else []
    assert policy.fits_emptied(EST, WANTED, devices, "n", others, 0) is fits


def test_load_request():
    devices = [gpu("gpu0", 8, "n"), cpu(node="n")]
    request = policy.load_request(entry("a"), WANTED, 4, NO_PLACEMENT, devices, True, "n")
    assert (request.path, request.num_ctx, request.num_batch, request.parallel) == (
        "/models/a.gguf", 4096, 512, 4,
    )  # fmt: skip
    assert [d.id for d in request.gpus] == ["n/gpu0"] and request.simulated
    assert (request.node, request.projector) == ("n", "")


@pytest.mark.parametrize(
    ("allocations", "expected"),
    [
        ((held("gpu0", 2), held("cpu", 1)), {"gpu0": 2 * GiB}),
        ((held("cpu", 1),), {}),
        ((Allocation("gpu0", 0, 0, 0),), {}),
    ],
)
def test_vram_held(allocations, expected):
    assert policy.vram_held(loaded(allocations=allocations)) == expected


def test_vram_to_watch_skips_shared_memory_and_unknown_devices():
    devices = [gpu("gpu0", 8), gpu("igpu", 8, integrated=True), cpu()]
    assert policy.vram_to_watch({"gpu0": 1, "igpu": 2, "gone": 3}, devices) == {"gpu0": 1}


@pytest.mark.parametrize(
    ("before", "now", "recovered"),
    [
        ({"gpu0": 0}, {"gpu0": 75}, True),
        ({"gpu0": 0}, {"gpu0": 74}, False),
        ({"gpu0": 10}, {"gpu0": 100}, True),
        ({}, {}, False),
    ],
)
def test_vram_recovered(before, now, recovered):
    assert policy.vram_recovered(before, now, {"gpu0": 100}) is recovered


def test_load_progress_is_kept_while_loading_and_held_to_0_1():
    progress = LoadProgress()
    with progress.tracking("m") as report:
        assert progress.loading() == {"m": 0.0}
        report(1.7)
        assert progress.loading() == {"m": 1.0}
        report(-1)
        assert progress.loading() == {"m": 0.0}
    assert progress.loading() == {}
    report(0.5)  # after the load: goes nowhere
    assert progress.loading() == {}


async def test_model_facts_read_each_file_once():
    reads: list[Path] = []

    def read(path: Path):
        reads.append(path)
        return info()

    facts = ModelFacts(read, read)
    a = await facts.model(Path("/a"))
    assert await facts.model(Path("/a")) is a and reads == [Path("/a")]
    assert await facts.projector(None) is None and reads == [Path("/a")]


class Alive:
    alive = True


async def test_slot_grants_go_in_turn_and_fail_when_the_model_goes():
    model = replace(loaded(), runner=Alive(), parallel=1)
    slots = SlotGrants(max_per_user=0)
    _, ann = slots.request(model, "ann")
    _, bob = slots.request(model, "bob")
    _, ann2 = slots.request(model, "ann")
    assert ann.done() and not bob.done() and model.users == {"ann": 1}
    assert slots.queued(model.key) == {"bob": 1, "ann": 1}
    slots.give_back(model, "ann")
    slots.dispatch()
    assert bob.done() and not ann2.done()  # served least recently: bob before ann again
    slots.fail_queued(model)
    with pytest.raises(Unloaded):
        ann2.result()
    assert slots.queued(model.key) == {} and model.refcount == 1
