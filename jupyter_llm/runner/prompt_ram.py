"""Prompt caches in host RAM: a slot's long prefix (its KV state) kept when
the slot is taken by another conversation, and put back when that
conversation returns (``LoadParams.prompt_ram``; llama-server's
``--cache-ram`` is the anchor).

When ``_assign`` is about to give a slot holding at least ``min_tokens``
tokens (and no image) to a prompt that keeps less than half of them, the
slot's state (``llama_state_seq_get_data``) is copied here first, ``swap``;
a prompt whose longest kept prefix is longer than what its slot holds gets
it back (``llama_state_seq_set_data``) and evaluates only the rest, before
the disk tier (``runner.prompt_disk``) is asked for a longer one. Only a
whole kept prefix is used, as on disk: a sliding-window (SWA) cache cannot
be cut back inside its window. A hit compares the tokens themselves.

The store is bounded by ``max_bytes`` (states and tokens) and
``max_entries``; the least recently used go first, and a new entry
replaces those that are its own prefixes (the same conversation, shorter).
It lives and dies with the runner process. Runs in the runner process only;
everything here blocks.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_llm.runner.prompt_disk import MIN_TOKENS, restore, slot_state, take_prefix

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.slot import Slot

MAX_ENTRIES = 64  # conversations kept per runner


@dataclass(frozen=True)
class RamParams:
    """``LoadParams.prompt_ram``: how much ({} leaves it off)."""

    max_bytes: int
    max_entries: int = MAX_ENTRIES
    min_tokens: int = MIN_TOKENS


class PromptRam:
    """One runner's prefixes in memory (see the module docstring)."""

    def __init__(self, params: RamParams) -> None:
        self.params = params
        self.entries: OrderedDict[int, tuple[array, bytes | bytearray]] = OrderedDict()  # LRU first
        self.bytes = 0
        self._next = 0

    @staticmethod
    def size(tokens: list[int] | array, state: bytes | bytearray) -> int:
        return 4 * len(tokens) + len(state)

    def lookup(
        self, tokens: list[int], longer_than: int = 0
    ) -> tuple[int, bytes | bytearray] | None:
        """The longest kept prefix of ``tokens`` longer than ``longer_than``
        tokens: its length and state; None if there is none."""
        best = None
        for key, (kept, _) in self.entries.items():
            n = len(kept)
            if longer_than < n <= len(tokens) and (best is None or n > best[1]):
                if array("i", tokens[:n]) == kept:
                    best = key, n
        if best is None:
            return None
        self.entries.move_to_end(best[0])  # used now
        return best[1], self.entries[best[0]][1]

    def holds(self, tokens: list[int]) -> bool:
        """Whether exactly ``tokens`` are kept (then they are used now)."""
        wanted = array("i", tokens)
        for key, (kept, _) in self.entries.items():
            if kept == wanted:
                self.entries.move_to_end(key)
                return True
        return False

    def store(self, tokens: list[int], state: bytes | bytearray) -> bool:
        """Keep ``state`` for ``tokens``, making room within the bounds; False
        if it is too short or too large. Kept prefixes of ``tokens`` go."""
        size = self.size(tokens, state)
        if len(tokens) < self.params.min_tokens or size > self.params.max_bytes:
            return False
        kept = array("i", tokens)
        for key, (old, _) in list(self.entries.items()):
            if len(old) <= len(kept) and kept[: len(old)] == old:
                self._drop(key)
        while self.entries and (
            self.bytes + size > self.params.max_bytes
            or len(self.entries) + 1 > self.params.max_entries
        ):
            self._drop(next(iter(self.entries)))
        self._next += 1
        self.entries[self._next] = (kept, state)
        self.bytes += size
        return True

    def _drop(self, key: int) -> None:
        tokens, state = self.entries.pop(key)
        self.bytes -= self.size(tokens, state)


# -- the engine's side -------------------------------------------------------------------
def open_ram(spec: dict[str, Any]) -> PromptRam | None:
    """The store ``LoadParams.prompt_ram`` asks for (None: off)."""
    if not spec:
        return None
    try:
        params = RamParams(**spec)
    except TypeError as e:
        print(f"runner: prompt cache in RAM off: {e}", file=sys.stderr)
        return None
    return PromptRam(params) if params.max_bytes > 0 and params.max_entries > 0 else None


def swap(engine: Engine, slot: Slot, tokens: list[int], keep: int) -> tuple[int, str]:
    """Before ``tokens`` go into ``slot``, which reuses ``keep`` of them: the
    slot's own long prefix saved in RAM if the new prompt keeps little of
    it, then the longest prefix longer than ``keep`` from RAM, else from
    disk. Returns the tokens now reused and where they are from ("ram",
    "disk", else "slot"). One token is always left to evaluate."""
    ram = engine.ram
    if ram is None:
        return restore(engine, slot, tokens, keep)
    if 2 * keep < len(slot.cached) and not slot.images:
        save(engine, slot)
    keep, source = take_prefix(ram, "ram", engine, slot, tokens, keep)
    keep, disk_source = restore(engine, slot, tokens, keep)  # a longer prefix on disk
    return keep, disk_source if disk_source != "slot" else source


def save(engine: Engine, slot: Slot) -> bool:
    """``slot``'s cache into RAM (a long one with no image, not kept yet)."""
    ram = engine.ram
    if ram is None or len(slot.cached) < ram.params.min_tokens or slot.images:
        return False
    if ram.holds(slot.cached):
        return False
    try:
        state = slot_state(engine, slot, ram.params.max_bytes - 4 * len(slot.cached))
        return state is not None and ram.store(list(slot.cached), state)
    except Exception as e:  # best effort: the new prompt goes on
        print(f"runner: prompt cache of slot {slot.index} not kept: {e!r}", file=sys.stderr)
        return False
