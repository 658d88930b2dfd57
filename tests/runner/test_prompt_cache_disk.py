"""Prompt caches on disk (runner/prompt_disk.py): the store's bounds, its
files, and real engines on the generated model and on Gemma (sliding-window
attention) that unload and come back to a disk hit whose greedy output
equals a cold run's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from runner_streams import text_and_done

from jupyter_llm.api.generation import Finished
from jupyter_llm.api.ollama_shapes import done_fields
from jupyter_llm.config import Settings, prompt_disk_dir
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory import Placement
from jupyter_llm.metrics.instruments import Completion
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.prompt_disk import (
    HEADER,
    DiskParams,
    PromptDisk,
    save_slots,
)
from jupyter_llm.runner.protocol import Complete, LoadParams
from jupyter_llm.runner_client.launch import LoadRequest, LoadSpec, prompt_disk_spec
from jupyter_llm.runner_client.launch import PromptDisk as PromptDiskSettings
from jupyter_llm.runner_client.proxy import start_runner_with

GREEDY = {"temperature": 0, "num_predict": 12, "seed": 1}


def store(tmp_path: Path, **kw: object) -> PromptDisk:
    args = {"dir": str(tmp_path / "cache"), "model": "sha256:aa|f16", "max_bytes": 1 << 20}
    args.update(kw)
    return PromptDisk(DiskParams(min_tokens=4, **args))  # type: ignore[arg-type]


def files(disk: PromptDisk) -> list[Path]:
    return sorted(p for p in disk.dir.iterdir())


# -- the store ---------------------------------------------------------------------------
def test_lookup_finds_the_longest_whole_prefix(tmp_path: Path) -> None:
    disk = store(tmp_path)
    assert disk.store(list(range(10)), b"ten")
    assert disk.store(list(range(20)), b"twenty")
    assert disk.lookup(list(range(30))) == (20, b"twenty")
    assert disk.lookup(list(range(15))) == (10, b"ten")
    assert disk.lookup(list(range(30)), longer_than=20) is None  # nothing better than the slot
    assert disk.lookup([1, *range(1, 30)]) is None  # a prefix matches only whole


def test_other_tokens_or_another_model_never_hit(tmp_path: Path) -> None:
    disk = store(tmp_path)
    mine = [5] * 12
    assert disk.store(mine, b"user a's state")
    assert disk.lookup([6] * 12 + [1]) is None  # another user's text: no hit
    other = store(tmp_path, model="sha256:bb|f16")
    assert other.lookup([*mine, 1]) is None  # same tokens, another model
    q8 = store(tmp_path, model="sha256:aa|q8_0")
    assert q8.lookup([*mine, 1]) is None  # another cache type
    assert disk.lookup([*mine, 1]) == (12, b"user a's state")


def test_a_colliding_name_with_other_tokens_is_no_hit(tmp_path: Path) -> None:
    """The name is a hash; the tokens inside decide."""
    disk = store(tmp_path)
    disk.store([1] * 8, b"state")
    (path,) = files(disk)
    forged = disk.dir / disk._name([2] * 8)
    path.rename(forged)
    assert disk.lookup([2] * 9) is None


def test_short_prefixes_and_oversized_states_are_not_saved(tmp_path: Path) -> None:
    disk = store(tmp_path, max_bytes=200)
    assert not disk.store([1, 2, 3], b"x")  # under min_tokens
    assert not disk.store(list(range(8)), b"x" * 200)  # over the whole budget
    assert files(disk) == []


def test_byte_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    clock = [1000.0]
    one = HEADER.size + 4 * 8 + 100
    disk = PromptDisk(
        DiskParams(str(tmp_path / "c"), "m", max_bytes=3 * one, min_tokens=4), lambda: clock[0]
    )
    for i in range(3):
        assert disk.store([i] * 8, bytes(100))
        os.utime(disk.dir / disk._name([i] * 8), (1000 + i, 1000 + i))
    assert disk.lookup([0] * 9) is not None  # 0 used now: 1 is the oldest
    assert disk.store([9] * 8, bytes(100))
    assert sum(p.stat().st_size for p in files(disk)) <= 3 * one
    assert disk.lookup([1] * 9) is None
    assert all(disk.lookup([i] * 9) is not None for i in (0, 2, 9))


def test_entry_count_bound(tmp_path: Path) -> None:
    disk = store(tmp_path, max_entries=3)
    for i in range(10):
        disk.store([i] * 8, b"s")
        assert len(files(disk)) <= 3
    assert len(files(disk)) == 3


def test_expired_files_are_deleted(tmp_path: Path) -> None:
    clock = [10_000.0]
    disk = PromptDisk(
        DiskParams(str(tmp_path / "c"), "m", 1 << 20, expiry=60, min_tokens=4), lambda: clock[0]
    )
    disk.store([1] * 8, b"s")
    os.utime(disk.dir / disk._name([1] * 8), (clock[0] - 30, clock[0] - 30))
    assert disk.lookup([1] * 9) is not None  # and used now (the real clock)
    os.utime(disk.dir / disk._name([1] * 8), (clock[0] - 61, clock[0] - 61))
    assert disk.lookup([1] * 9) is None
    assert files(disk) == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_a_damaged_file_is_ignored_and_removed(tmp_path: Path, damage: str) -> None:
    disk = store(tmp_path)
    disk.store(list(range(8)), b"state" * 10)
    (path,) = files(disk)
    data = bytearray(path.read_bytes())
    if damage == "truncate":  # a half-written file (as a crash would leave without rename)
        data = data[: len(data) - 7]
    elif damage == "flip":
        data[-3] ^= 0xFF
    else:
        data[:8] = b"NOTMAGIC"
    path.write_bytes(bytes(data))
    assert disk.lookup(list(range(9))) is None
    assert files(disk) == []


def test_writes_are_atomic_and_private(tmp_path: Path) -> None:
    """No temporary file is left; a stale one from a killed runner is cleaned."""
    disk = store(tmp_path)
    stale = disk.dir / ".tmp-123-x.kv"
    stale.write_bytes(b"half")
    os.utime(stale, (1, 1))
    disk.store(list(range(8)), b"s")
    (path,) = files(disk)
    assert path.suffix == ".kv" and (path.stat().st_mode & 0o077) == 0


# -- real engines --------------------------------------------------------------------------
def load(path: Path, cache: Path | None, digest: str = "sha256:demo", **kw: object) -> Engine:
    disk = {}
    if cache is not None:
        disk = {
            "dir": str(cache),
            "model": f"{digest}|f16",
            "max_bytes": 64 << 20,
            "min_tokens": 64,
        }
    params = {"n_ctx": 1024, "n_batch": 64, "n_seq": 2, "prompt_disk": disk, **kw}
    return Engine(LoadParams(path=str(path), **params))  # type: ignore[arg-type]


def run(engine: Engine, prompt: str) -> tuple[str, int]:
    out: list[str] = []
    done = engine.complete(prompt, dict(GREEDY), out.append, lambda: False)
    assert done.prompt_cache == ("" if not done.prompt_cached else done.prompt_cache)
    engine.last_source = done.prompt_cache  # type: ignore[attr-defined]
    return "".join(out), done.prompt_cached


def unload_and_return(model: Path, tmp_path: Path, first: str, second: str) -> None:
    cache = tmp_path / "cache"
    engine = load(model, cache)
    try:
        answer, _ = run(engine, first)
        assert save_slots(engine) == 1
    finally:
        engine.close()
    assert len(list(cache.glob("*.kv"))) == 1
    follow = first + answer + second
    cold = load(model, None)
    try:
        cold_text, cold_cached = run(cold, follow)
    finally:
        cold.close()
    assert cold_cached == 0
    again = load(model, cache)  # a new runner: the unload or restart is over
    try:
        text, cached = run(again, follow)
        assert again.last_source == "disk"  # type: ignore[attr-defined]
        _, from_slot = run(again, follow)  # the slot holds it now
        assert from_slot and again.last_source == "slot"  # type: ignore[attr-defined]
    finally:
        again.close()
    assert cached >= 64  # restored from disk, evaluated only the rest
    assert text == cold_text


def test_generated_model_second_turn_after_unload(tmp_path: Path) -> None:
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    first = "The notebook's first question about pandas DataFrames. " * 8
    unload_and_return(model, tmp_path, first, " And a second question.")


def test_off_switch_and_another_model_digest(tmp_path: Path) -> None:
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    prompt = "A prompt that is long enough to be kept on disk. " * 8
    engine = load(model, None)
    try:
        run(engine, prompt)
        assert engine.disk is None and save_slots(engine) == 0
    finally:
        engine.close()
    cache = tmp_path / "cache"
    engine = load(model, cache)
    try:
        run(engine, prompt)
        save_slots(engine)
    finally:
        engine.close()
    other = load(model, cache, digest="sha256:other")
    try:
        _, cached = run(other, prompt + " more")
    finally:
        other.close()
    assert cached == 0


def test_gemma_second_turn_after_unload(gemma_gguf: Path, tmp_path: Path) -> None:
    """Gemma 3's sliding-window layers hold only their window: the whole
    saved prefix is restored and the rest evaluated, as a cold run would."""
    # 626 tokens: past the 512-token window
    first = "Summarise this notebook cell and explain each step in detail. " * 52
    unload_and_return(gemma_gguf, tmp_path, first, " Now explain the second cell.")


# -- the server's side: the key, and a real runner process ---------------------------------
BLOB = "sha256-" + "ab" * 32


def request(path: str, **kw: Any) -> LoadRequest:
    args = {"num_ctx": 1024, "num_batch": 64, "num_thread": 0, "use_mmap": True, "parallel": 2}
    return LoadRequest(path=path, placement=Placement((), (), 0, 0), **{**args, **kw})


def test_the_key_is_the_blob_digest_and_the_cache_layout(tmp_path: Path) -> None:
    disk = PromptDiskSettings(str(tmp_path), 1 << 30, 3600.0)
    spec = prompt_disk_spec(request(f"/m/blobs/{BLOB}", kv_cache_type="q8_0"), disk)
    assert spec == {
        "dir": str(tmp_path),
        "model": f"sha256:{'ab' * 32}|q8_0|fa-auto",
        "max_bytes": 1 << 30,
        "expiry": 3600.0,
    }
    assert prompt_disk_spec(request("/elsewhere/model.gguf"), disk) == {}  # no digest: off
    off = PromptDiskSettings(str(tmp_path), 0, 3600.0)
    assert prompt_disk_spec(request(f"/m/blobs/{BLOB}"), off) == {}


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"JUPYTER_LLM_PROMPT_DISK_CACHE": "-1"}, "JUPYTER_LLM_PROMPT_DISK_CACHE"),
        ({"JUPYTER_LLM_PROMPT_DISK_EXPIRY": "0"}, "JUPYTER_LLM_PROMPT_DISK_EXPIRY"),
        ({"JUPYTER_LLM_PROMPT_DISK_CACHE": "lots"}, "JUPYTER_LLM_PROMPT_DISK_CACHE"),
    ],
)
def test_settings_bounds(env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        Settings.from_env(env)


def test_settings_defaults(tmp_path: Path) -> None:
    settings = Settings.from_env({"JUPYTER_LLM_MODELS": str(tmp_path)})
    assert settings.prompt_disk_cache == 1 << 30 and settings.prompt_disk_expiry == 86400
    assert prompt_disk_dir(settings) == tmp_path / "prompt-cache"
    off = Settings.from_env(
        {"JUPYTER_LLM_PROMPT_DISK_CACHE": "0", "JUPYTER_LLM_PROMPT_DISK_EXPIRY": "2h"}
    )
    assert off.prompt_disk_cache == 0 and off.prompt_disk_expiry == 7200
    never = Settings.from_env({"JUPYTER_LLM_PROMPT_DISK_EXPIRY": "-1"})  # as keep_alive
    assert never.prompt_disk_expiry == float("inf")  # the budget and the count still bound it


async def answer(runner: Any, prompt: str) -> tuple[str, dict[str, Any]]:
    return await text_and_done(runner.complete(Complete(prompt=prompt, options=dict(GREEDY))))


async def test_a_runner_saves_at_unload_and_the_next_runner_restores(tmp_path: Path) -> None:
    """A real runner process, closed as keep_alive expiry or eviction closes
    it; a new runner of the same blob answers the second turn from disk."""
    blob = tmp_path / "blobs" / BLOB
    blob.parent.mkdir()
    write_demo_model(blob, DemoModelSpec())
    cache = tmp_path / "prompt-cache"
    disk = PromptDiskSettings(str(cache), 64 << 20, 3600.0)

    def spec(on: bool) -> LoadSpec:
        disk_spec = prompt_disk_spec(request(str(blob)), disk if on else None)
        disk_spec = {**disk_spec, "min_tokens": 64} if disk_spec else {}
        return LoadSpec(path=str(blob), n_ctx=1024, n_batch=64, n_seq=2, prompt_disk=disk_spec)

    first = "The first cell of a notebook, explained at length. " * 8
    runner = await start_runner_with(spec(True), load_timeout=60)
    try:
        reply, _ = await answer(runner, first)
    finally:
        await runner.close()  # what an unload does
    assert len(list(cache.glob("*.kv"))) == 1
    follow = first + reply + " And the second cell?"
    cold = await start_runner_with(spec(False), load_timeout=60)
    try:
        cold_text, cold_done = await answer(cold, follow)
    finally:
        await cold.close()
    again = await start_runner_with(spec(True), load_timeout=60)
    try:
        text, done = await answer(again, follow)
    finally:
        await again.close()
    assert cold_done["prompt_cached"] == 0 and cold_done.get("prompt_cache", "") == ""
    assert done["prompt_cached"] >= 64 and done["prompt_cache"] == "disk"
    assert text == cold_text


# -- what a client sees: the final chunk and the metric -------------------------------------
@pytest.mark.parametrize(
    ("source", "cached", "expected"),
    [
        ("disk", 1908, {"prompt_cache": "disk", "prompt_cached": 1908}),
        ("ram", 10, {"prompt_cache": "ram", "prompt_cached": 10}),
        ("slot", 10, {}),  # a slot's own reuse stays out of Ollama's chunk, as before
        ("", 0, {}),
        ("disk", 0, {}),
    ],
)
def test_final_chunk_reports_a_hit_that_outlived_its_slot(
    source: str, cached: int, expected: dict[str, Any]
) -> None:
    done = Finished("stop", 5, 1, 1, 1, 1, 1, [], prompt_cached=cached, prompt_cache=source)
    chunk = done_fields(done)
    assert {k: chunk[k] for k in ("prompt_cache", "prompt_cached") if k in chunk} == expected


def test_hits_are_counted_by_source_with_bounded_labels() -> None:
    def hits(source: str) -> float:
        value = REGISTRY.get_sample_value(
            "jupyter_llm_prompt_cache_hits_total", {"model": "m-c2", "source": source}
        )
        return value or 0.0

    before = {s: hits(s) for s in ("slot", "disk")}
    completion = Completion("m-c2", "u")
    completion.cache_hit("disk")
    completion.cache_hit("slot")
    completion.cache_hit("")  # no hit
    completion.cache_hit("elsewhere")  # never a label value
    assert hits("disk") == before["disk"] + 1 and hits("slot") == before["slot"] + 1
    assert hits("elsewhere") == 0
