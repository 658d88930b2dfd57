"""Prompt caches in host RAM (runner/prompt_ram.py): the store's bounds, and
real engines with one decode slot on the generated model and on Gemma
(sliding-window attention) where another conversation takes the first one's
cache, which comes back from RAM with greedy output equal to a cold run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runner_streams import text_and_done

from jupyter_llm.config import Settings
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.prompt_disk import save_slots
from jupyter_llm.runner.prompt_ram import PromptRam, RamParams, open_ram
from jupyter_llm.runner.protocol import Complete, LoadParams
from jupyter_llm.runner_client.launch import LoadSpec, prompt_ram_spec
from jupyter_llm.runner_client.proxy import start_runner_with

GREEDY = {"temperature": 0, "num_predict": 12, "seed": 1}
RAM = {"max_bytes": 256 << 20}


def store(**kw: int) -> PromptRam:
    return PromptRam(RamParams(**{"max_bytes": 1 << 20, "min_tokens": 4, **kw}))


# -- the store ---------------------------------------------------------------------------
def test_lookup_finds_the_longest_whole_prefix() -> None:
    ram = store()
    assert ram.store(list(range(10)), b"ten")
    assert ram.store([1] * 20, b"twenty")
    assert ram.lookup(list(range(30))) == (10, b"ten")
    assert ram.lookup([1] * 30) == (20, b"twenty")
    assert ram.lookup(list(range(30)), longer_than=10) is None  # nothing better than the slot
    assert ram.lookup(list(range(9))) is None  # shorter than the kept prefix
    assert ram.lookup([0, 2, *range(2, 30)]) is None  # a prefix matches only whole


def test_a_longer_turn_replaces_its_own_prefix() -> None:
    ram = store()
    ram.store(list(range(10)), b"turn one")
    ram.store(list(range(20)), b"turn two")
    assert len(ram.entries) == 1 and ram.lookup(list(range(30))) == (20, b"turn two")
    assert ram.bytes == 4 * 20 + len(b"turn two")


def test_short_prefixes_and_oversized_states_are_not_kept() -> None:
    ram = store(max_bytes=200)
    assert not ram.store([1, 2, 3], b"x")  # under min_tokens
    assert not ram.store(list(range(8)), b"x" * 200)  # over the whole budget
    assert not ram.entries and ram.bytes == 0


def test_byte_budget_evicts_least_recently_used_and_is_never_exceeded() -> None:
    one = 4 * 8 + 100
    ram = store(max_bytes=3 * one)
    for i in range(3):
        assert ram.store([i] * 8, bytes(100))
    assert ram.lookup([0] * 9) is not None  # 0 used now: 1 is the oldest
    assert ram.store([9] * 8, bytes(100))
    assert ram.bytes == 3 * one
    assert ram.lookup([1] * 9) is None
    assert all(ram.lookup([i] * 9) is not None for i in (0, 2, 9))
    for i in range(10, 40):
        ram.store([i] * (8 + i % 5), bytes(50 + i))
        assert ram.bytes <= 3 * one
        assert ram.bytes == sum(4 * len(t) + len(s) for t, s in ram.entries.values())


def test_entry_count_bound() -> None:
    ram = store(max_entries=3)
    for i in range(10):
        ram.store([i] * 8, b"s")
        assert len(ram.entries) <= 3
    assert len(ram.entries) == 3


def test_zero_or_nothing_is_off() -> None:
    assert open_ram({}) is None
    assert open_ram({"max_bytes": 0}) is None
    assert open_ram({"max_bytes": 1 << 20, "unknown": 1}) is None
    assert open_ram({"max_bytes": 1 << 20}) is not None


# -- real engines --------------------------------------------------------------------------
def load(path: Path, ram: int, **kw: object) -> Engine:
    spec = {"max_bytes": ram, "min_tokens": 64} if ram else {}
    params = {"n_ctx": 4096, "n_batch": 64, "n_seq": 1, "prompt_ram": spec, **kw}
    return Engine(LoadParams(path=str(path), **params))  # type: ignore[arg-type]


def run(engine: Engine, prompt: str) -> tuple[str, int, str]:
    out: list[str] = []
    done = engine.complete(prompt, dict(GREEDY), out.append, lambda: False)
    return "".join(out), done.prompt_cached, done.prompt_cache


async def answer(runner: Any, prompt: str) -> tuple[str, dict[str, Any]]:
    return await text_and_done(runner.complete(Complete(prompt=prompt, options=dict(GREEDY))))


def slot_taken_and_back(model: Path, first: str, other: str, second: str, **kw: object) -> None:
    """A's first turn; other conversations take every slot (A's cache is
    gone from the context); A's second turn comes back from RAM."""
    engine = load(model, 256 << 20, **kw)
    try:
        answer, _, _ = run(engine, first)
        mine = max(engine.slots, key=lambda s: len(s.cached)).cached[:64]
        for i in range(len(engine.slots)):  # the spare ids' slots too
            run(engine, f"{i}: {other}")
        assert not any(s.cached[:64] == mine for s in engine.slots)  # A's cache is gone
        assert len(engine.ram.entries) >= 1  # type: ignore[union-attr]
        follow = first + answer + second
        text, cached, source = run(engine, follow)
        assert source == "ram" and cached >= 64
        assert engine.ram.bytes <= engine.ram.params.max_bytes  # type: ignore[union-attr]
        _, again, again_source = run(engine, follow)  # the slot holds it now
        assert again and again_source == "slot"
    finally:
        engine.close()
    cold = load(model, 0, **kw)
    try:
        cold_text, cold_cached, _ = run(cold, follow)
        assert cold.ram is None and cold_cached == 0
    finally:
        cold.close()
    assert text == cold_text


def test_generated_model_second_turn_after_the_slot_was_taken(tmp_path: Path) -> None:
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    first = "The notebook's first question about pandas DataFrames. " * 8
    other = "Another user's notebook asks about matplotlib figures instead. " * 8
    slot_taken_and_back(model, first, other, " And a second question.")


def test_generated_model_cache_dropped_for_room_is_kept(tmp_path: Path) -> None:
    """A full context drops the idle caches first: they go to RAM too."""
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    first = "The notebook's first question about pandas DataFrames. " * 8  # ~450 tokens
    other = "Another user's notebook asks about matplotlib figures instead. " * 8
    slot_taken_and_back(model, first, other, " And a second question.", n_ctx=768)


def test_gemma_second_turn_after_the_slot_was_taken(gemma_gguf: Path) -> None:
    """Gemma 3's sliding-window layers hold only their window: the whole kept
    prefix is restored and the rest evaluated, as a cold run would."""
    # 626 tokens: past the 512-token window
    first = "Summarise this notebook cell and explain each step in detail. " * 52
    other = "Plot the sales by region as a bar chart with labelled axes. " * 4
    slot_taken_and_back(gemma_gguf, first, other, " Now explain the second cell.", n_batch=512)


def test_zero_disables_and_the_budget_holds(tmp_path: Path) -> None:
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    first = "The notebook's first question about pandas DataFrames. " * 8
    other = "Another user's notebook asks about matplotlib figures instead. " * 8
    engine = load(model, 0)
    try:
        answer, _, _ = run(engine, first)
        for i in range(len(engine.slots)):
            run(engine, f"{i}: {other}")
        assert engine.ram is None
        _, cached, source = run(engine, first + answer + " More.")
        assert cached == 0 and source == ""
    finally:
        engine.close()
    tight = load(model, 64 << 10)  # smaller than one conversation's state
    try:
        answer, _, _ = run(tight, first)
        for i in range(len(tight.slots)):
            run(tight, f"{i}: {other}")
        assert tight.ram is not None and not tight.ram.entries and tight.ram.bytes == 0
        _, cached, _ = run(tight, first + answer + " More.")
        assert cached == 0
    finally:
        tight.close()


def test_kept_prefixes_go_to_disk_at_unload(tmp_path: Path) -> None:
    """A conversation whose slot was taken, then the model unloads: the next
    runner finds its prefix on disk."""
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    first = "The notebook's first question about pandas DataFrames. " * 8
    other = "Another user's notebook asks about matplotlib figures instead. " * 8
    disk = {"dir": str(tmp_path / "cache"), "model": "sha256:demo|f16", "max_bytes": 64 << 20}
    engine = load(model, 256 << 20, prompt_disk={**disk, "min_tokens": 64})
    try:
        answer, _, _ = run(engine, first)
        for i in range(len(engine.slots)):
            run(engine, f"{i}: {other}")
        assert save_slots(engine) == 3  # the two slots, then A's prefix from RAM
    finally:
        engine.close()
    again = load(model, 0, prompt_disk={**disk, "min_tokens": 64})
    try:
        _, cached, source = run(again, first + answer + " And a second question.")
    finally:
        again.close()
    assert source == "disk" and cached >= 64


async def test_a_runner_process_reports_ram(tmp_path: Path) -> None:
    """``LoadParams.prompt_ram`` through a real runner process: the done
    message of the second turn says "ram", and what the runner holds (its
    load's figures, then what a request's end said) counts the prompts kept."""
    model = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    spec = LoadSpec(
        path=str(model), n_ctx=4096, n_batch=64, n_seq=1, prompt_ram={**RAM, "min_tokens": 64}
    )
    first = "The first cell of a notebook, explained at length. " * 8
    runner = await start_runner_with(spec, load_timeout=60)
    try:
        reply, _ = await answer(runner, first)
        for i in range(2):  # the slot and its spare id
            await answer(runner, f"{i}: another user's cell about plotting figures. " * 8)
        _, done = await answer(runner, first + reply + " And the second cell?")
        kept = runner.measured["cpu"]["kv_cache"] - runner.measured_at_load["cpu"]["kv_cache"]
    finally:
        await runner.close()
    assert done["prompt_cache"] == "ram" and done["prompt_cached"] >= 64
    assert kept > 0  # the prompts in RAM


# -- the setting ---------------------------------------------------------------------------
def test_setting_default_off_and_bounds() -> None:
    settings = Settings.from_env({})
    assert settings.prompt_ram_cache == 512 << 20
    assert prompt_ram_spec(settings.prompt_ram_cache) == {"max_bytes": 512 << 20}
    off = Settings.from_env({"JUPYTER_LLM_PROMPT_RAM_CACHE": "0"})
    assert off.prompt_ram_cache == 0 and prompt_ram_spec(0) == {}
    for bad in ("-1", "lots"):
        with pytest.raises(ConfigError, match="JUPYTER_LLM_PROMPT_RAM_CACHE"):
            Settings.from_env({"JUPYTER_LLM_PROMPT_RAM_CACHE": bad})
