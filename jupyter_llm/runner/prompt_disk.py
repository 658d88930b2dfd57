"""Prompt caches on disk: a model's long prefixes (their KV state) kept across
unloads, ``keep_alive`` expiry and restarts (``LoadParams.prompt_disk``).

When the runner is told to stop, each slot holding at least ``min_tokens``
tokens (and no image) is written to one file, ``save_slots``, within
``SAVE_SECONDS``; a later prompt whose longest stored prefix is longer than
what its slot holds restores it (``llama_state_seq_set_data``) and evaluates
only the rest, ``restore``. Only a whole stored prefix is ever used: a
sliding-window (SWA) cache cannot be cut back inside its window.

A file's name is the model key's hash, the prefix length and the hash of the
tokens themselves; the file holds the tokens, the state and a checksum. A
hit is verified by comparing the tokens, so one user's prompt never gets
another's state unless their tokens are equal. The model key is the GGUF's
sha256 digest with the cache's type (the server passes it). Files are
written to a temporary name and renamed (never half-written); the whole
directory is held to ``max_bytes`` and ``max_entries`` (least recently used
go first), a file unused for ``expiry`` seconds is deleted, and a file
whose size, header or checksum is wrong is removed when read.
Runs in the runner process only; everything here blocks.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import struct
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp

if TYPE_CHECKING:
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.slot import Slot

MAGIC = b"JLLMKV1\n"
HEADER = struct.Struct("<8sIQ32s")  # magic, tokens, state bytes, blake2b of tokens + state
SUFFIX = ".kv"
TEMP_PREFIX = ".tmp-"
STALE_TEMP = 3600.0  # a temporary file this old was left by a killed runner
MAX_ENTRIES = 256  # files in the directory, every model together
MIN_TOKENS = 256  # shorter prefixes are cheap to evaluate again
SAVE_SECONDS = 3.0  # at unload: the server kills a runner that takes 5 s to close


@dataclass(frozen=True)
class DiskParams:
    """``LoadParams.prompt_disk``: where and how much ({} leaves it off)."""

    dir: str
    model: str  # the model's identity: the GGUF's digest and the cache's type
    max_bytes: int
    expiry: float = 86400.0
    max_entries: int = MAX_ENTRIES
    min_tokens: int = MIN_TOKENS


@dataclass(frozen=True)
class Entry:
    path: Path
    model: str  # the model key's hash in the name
    n_tokens: int
    key: str  # the tokens' hash in the name
    size: int
    used: float  # mtime: the last save or hit


class PromptDisk:
    """One model's view of the shared directory (see the module docstring)."""

    def __init__(self, params: DiskParams, clock: Callable[[], float] = time.time) -> None:
        self.params = params
        self.dir = Path(params.dir)
        self.clock = clock
        self.model = hashlib.blake2b(params.model.encode(), digest_size=8).hexdigest()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- names -------------------------------------------------------------------------
    def _key(self, tokens: list[int]) -> str:
        data = self.model.encode() + array("i", tokens).tobytes()
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def _name(self, tokens: list[int]) -> str:
        return f"{self.model}-{len(tokens):08d}-{self._key(tokens)}{SUFFIX}"

    def entries(self) -> list[Entry]:
        """Every file in the directory (all models); expired ones and stale
        temporary files are deleted on the way."""
        out = []
        now = self.clock()
        with contextlib.suppress(OSError), os.scandir(self.dir) as it:
            for item in it:
                try:
                    st = item.stat()
                except OSError:
                    continue
                if item.name.startswith(TEMP_PREFIX):
                    if now - st.st_mtime > STALE_TEMP:
                        _unlink(Path(item.path))
                    continue
                parts = item.name.removesuffix(SUFFIX).split("-")
                if not item.name.endswith(SUFFIX) or len(parts) != 3 or not parts[1].isdigit():
                    continue
                if now - st.st_mtime > self.params.expiry:
                    _unlink(Path(item.path))
                    continue
                out.append(
                    Entry(
                        Path(item.path), parts[0], int(parts[1]), parts[2], st.st_size, st.st_mtime
                    )
                )
        return out

    # -- reading -----------------------------------------------------------------------
    def lookup(self, tokens: list[int], longer_than: int = 0) -> tuple[int, bytes] | None:
        """The longest stored prefix of ``tokens`` longer than ``longer_than``
        tokens: its length and state; None if there is none."""
        mine = [
            e for e in self.entries()
            if e.model == self.model and longer_than < e.n_tokens <= len(tokens)
        ]  # fmt: skip
        for entry in sorted(mine, key=lambda e: -e.n_tokens):
            if entry.key != self._key(tokens[: entry.n_tokens]):
                continue
            state = self._read(entry, tokens[: entry.n_tokens])
            if state is not None:
                return entry.n_tokens, state
        return None

    def _read(self, entry: Entry, tokens: list[int]) -> bytes | None:
        """The file's state if it is whole and holds exactly ``tokens``; a bad
        file is removed."""
        try:
            with open(entry.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(HEADER.size)
                if len(head) != HEADER.size:
                    raise ValueError("short header")
                magic, n, n_state, check = HEADER.unpack(head)
                if magic != MAGIC or n != len(tokens):
                    raise ValueError("not a prompt cache file")
                if n_state > self.params.max_bytes or size != HEADER.size + 4 * n + n_state:
                    raise ValueError("wrong size")
                body = f.read(4 * n + n_state)
        except FileNotFoundError:
            return None  # another runner evicted it
        except (OSError, ValueError) as e:
            print(f"runner: prompt cache file {entry.path.name} ignored: {e}", file=sys.stderr)
            _unlink(entry.path)
            return None
        if hashlib.blake2b(body, digest_size=32).digest() != check:
            print(f"runner: prompt cache file {entry.path.name} is corrupt", file=sys.stderr)
            _unlink(entry.path)
            return None
        if array("i", body[: 4 * n]).tolist() != tokens:
            return None  # a hash collision: someone else's prefix
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # used now (LRU)
        return body[4 * n :]

    # -- writing -----------------------------------------------------------------------
    def store(self, tokens: list[int], state: bytes) -> bool:
        """Keep ``state`` for ``tokens`` (atomically), making room within the
        bounds; False if it is too short, too large, or already stored."""
        size = HEADER.size + 4 * len(tokens) + len(state)
        if len(tokens) < self.params.min_tokens or size > self.params.max_bytes:
            return False
        path = self.dir / self._name(tokens)
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)
            return False
        self._make_room(size)
        body = array("i", tokens).tobytes() + state
        check = hashlib.blake2b(body, digest_size=32).digest()
        temp = self.dir / f"{TEMP_PREFIX}{os.getpid()}-{path.name}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(HEADER.pack(MAGIC, len(tokens), len(state), check))
                f.write(body)
            os.replace(temp, path)
        except OSError as e:
            print(f"runner: prompt cache not saved: {e}", file=sys.stderr)
            _unlink(temp)
            return False
        return True

    def _make_room(self, size: int) -> None:
        """Delete the least recently used files until ``size`` more bytes and
        one more file fit the bounds."""
        entries = sorted(self.entries(), key=lambda e: e.used)
        total = sum(e.size for e in entries)
        while entries and (
            total + size > self.params.max_bytes or len(entries) + 1 > self.params.max_entries
        ):
            gone = entries.pop(0)
            _unlink(gone.path)
            total -= gone.size


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


# -- the engine's side -------------------------------------------------------------------
def open_disk(spec: dict[str, Any]) -> PromptDisk | None:
    """The store ``LoadParams.prompt_disk`` asks for (None: off, or unusable)."""
    if not spec:
        return None
    try:
        params = DiskParams(**spec)
        if params.max_bytes <= 0 or not params.model:
            return None
        return PromptDisk(params)
    except (TypeError, OSError) as e:
        print(f"runner: prompt cache on disk off: {e}", file=sys.stderr)
        return None


def restore(engine: Engine, slot: Slot, tokens: list[int], keep: int) -> tuple[int, str]:
    """Before ``tokens`` go into ``slot``, which reuses ``keep`` of them: the
    longest stored prefix longer than that, restored into the slot. Returns
    the tokens now reused and where they are from ("disk", else "slot":
    ``keep``, where nothing better is on disk). One token is always left to
    evaluate: its logits start the answer."""
    return take_prefix(engine.disk, "disk", engine, slot, tokens, keep)


def take_prefix(
    store: Any, source: str, engine: Engine, slot: Slot, tokens: list[int], keep: int
) -> tuple[int, str]:
    """``restore`` from ``store`` (this tier, or the RAM tier's, which has the
    same ``lookup`` and ``params.min_tokens``), reported as ``source``; ""
    and nothing reused where llama.cpp refuses the state."""
    if store is None or len(tokens) - 1 <= max(keep, store.params.min_tokens - 1):
        return keep, "slot"
    if any(t < 0 for t in tokens):  # images: never stored
        return keep, "slot"
    hit = store.lookup(tokens[:-1], longer_than=keep)
    if hit is None:
        return keep, "slot"
    n, state = hit
    if not put_state(engine, slot, tokens[:n], state):
        return 0, ""  # llama.cpp refused it (another layout): evaluate it all
    return n, source


def slot_state(engine: Engine, slot: Slot, max_bytes: int) -> bytearray | None:
    """``slot``'s KV state (``llama_state_seq_get_data``), None where it is
    empty or larger than ``max_bytes``."""
    size = llama_cpp.llama_state_seq_get_size(engine.ctx, slot.index)
    if size <= 0 or size > max_bytes:
        return None
    state = bytearray(size)
    buf = (ctypes.c_uint8 * size).from_buffer(state)
    written = llama_cpp.llama_state_seq_get_data(engine.ctx, buf, size, slot.index)
    del buf
    if not written:
        return None
    return state if written == size else state[:written]


def put_state(engine: Engine, slot: Slot, tokens: list[int], state: bytes | bytearray) -> bool:
    """Replace ``slot``'s cache with ``state``, the KV of ``tokens`` (the RAM
    tier's too), after idle caches made room for it as a prompt's would.
    False, and the slot empty, where llama.cpp refuses it."""
    llama_cpp.llama_memory_seq_rm(engine.memory, slot.index, -1, -1)
    slot.truncate(0)
    while sum(len(s.cached) for s in engine.slots) + len(tokens) > engine.n_ctx:
        if not engine._drop_idle_cache():
            break
    if isinstance(state, bytearray):  # no copy
        buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    else:
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    if llama_cpp.llama_state_seq_set_data(engine.ctx, buf, len(state), slot.index) == 0:
        llama_cpp.llama_memory_seq_rm(engine.memory, slot.index, -1, -1)
        return False
    slot.cached[:] = tokens
    return True


def save_slots(engine: Engine, seconds: float = SAVE_SECONDS) -> int:
    """At unload: each slot's long prefix to disk, most recently used first,
    then the prefixes kept in RAM (``runner.prompt_ram``), until ``seconds``
    have passed. Returns the files written."""
    disk = engine.disk
    if disk is None:
        return 0
    deadline = time.monotonic() + seconds
    saved = 0
    slots = sorted(engine.slots, key=lambda s: -s.last_used)
    for slot in slots:
        if time.monotonic() >= deadline:
            break
        if len(slot.cached) < disk.params.min_tokens or slot.images:
            continue
        try:
            state = slot_state(engine, slot, disk.params.max_bytes)
            if state is not None and disk.store(list(slot.cached), bytes(state)):
                saved += 1
        except Exception as e:  # saving is best effort: the unload goes on
            print(f"runner: prompt cache of slot {slot.index} not saved: {e!r}", file=sys.stderr)
    kept = list(engine.ram.entries.values()) if engine.ram is not None else []
    for tokens, state in reversed(kept):  # then the RAM tier's, most recently used first
        if time.monotonic() >= deadline:
            break
        saved += disk.store(tokens.tolist(), state)
    return saved
