"""A bounded reader for GGUF headers (v2 and v3, little-endian).

Model files come from uploads and pulls, so their headers are hostile input
parsed inside the Jupyter server. Every count and length is checked against
the bytes left in the file and against a fixed cap *before* anything is
allocated or looped over, the file is read front to back once, and the
values kept in memory are charged to a budget. Long arrays that callers do
not need (a tokenizer's 262k tokens) are kept as their length only.

Layout (ggml's ``gguf.h``): magic ``GGUF``, u32 version, u64 tensor count,
u64 key/value count; each key/value is a string key, a u32 value type and
the value (an array is a u32 item type, a u64 length and the items); each
tensor info is a string name, u32 n_dims, u64 dims, u32 ggml type and a u64
offset into the data section, which starts at the next multiple of
``general.alignment``. A string is a u64 length and that many UTF-8 bytes.

Pure parsing: no HTTP here. Errors are ``GGUFFormatError`` with a message
for users; callers turn them into their own error types.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Caps, far above any real model (largest vocabularies: ~262k tokens; most
# tensors: a few thousand; longest strings: chat templates and licenses).
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 16
MAX_STRING = 16 << 20  # bytes in one string
MAX_NAME = 64  # ggml's GGML_MAX_NAME: a tensor name is shorter than this
MAX_ARRAY = 1 << 21  # items in one array
MAX_ITEMS = 1 << 22  # array items in the whole header, kept or skipped
MAX_ARRAYS = 1 << 16  # array values in the whole header, nested ones included
MAX_NESTING = 3  # arrays of arrays of arrays (llama.cpp itself loads none)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_KEPT = 96 << 20  # bytes of values kept in memory, as charged below
_OVERHEAD = 32  # Python's cost of one kept value beyond its raw bytes (measured)
_LIST = 64  # and of one kept list
_CHUNK = 1 << 20

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12
_SCALARS: dict[int, struct.Struct] = {
    UINT8: struct.Struct("<B"),
    INT8: struct.Struct("<b"),
    UINT16: struct.Struct("<H"),
    INT16: struct.Struct("<h"),
    UINT32: struct.Struct("<I"),
    INT32: struct.Struct("<i"),
    FLOAT32: struct.Struct("<f"),
    BOOL: struct.Struct("<?"),
    UINT64: struct.Struct("<Q"),
    INT64: struct.Struct("<q"),
    FLOAT64: struct.Struct("<d"),
}
_U32 = _SCALARS[UINT32]
_U64 = _SCALARS[UINT64]
_MIN_ITEM = {STRING: 8, ARRAY: 12}  # an empty string / an empty array


class GGUFFormatError(ValueError):
    """The file is not a GGUF header this server accepts; ``str(e)`` says why."""


@dataclass(frozen=True)
class LongArray:
    """An array kept as its length only (its items were skipped, not read)."""

    item_type: int
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ne[0] first, as in the file
    ggml_type: int
    offset: int  # into the data section
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]  # arrays are lists, or LongArray past the limit
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int  # where tensor data starts in the file
    header_bytes: int  # bytes the header itself takes (all that was read)


@functools.cache
def ggml_type_sizes() -> dict[int, tuple[int, int]]:
    """(block size, bytes per block) of each ggml type, from the gguf package
    (loaded on first use: importing it costs numpy)."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (int(b), int(s)) for t, (b, s) in GGML_QUANT_SIZES.items()}


class _Source:
    """Sequential reads from a file of known size, refused before they run
    past its end; never reads a byte twice."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size
        self.buf = b""
        self.at = 0  # position in buf
        self.base = 0  # file offset of buf[0]

    @property
    def pos(self) -> int:
        return self.base + self.at

    @property
    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            raise GGUFFormatError(
                f"{what} needs {n} bytes but only {self.left} are left in the file"
            )

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        if self.at + n > len(self.buf):
            rest = self.buf[self.at :]
            want = min(max(n - len(rest), _CHUNK), self.size - self.base - len(self.buf))
            more = self.f.read(want)
            if len(more) != want:
                raise GGUFFormatError("the file is shorter than its size (changed while read?)")
            self.base, self.buf, self.at = self.pos, rest + more, 0
        out = self.buf[self.at : self.at + n]
        self.at += n
        return out

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        if self.at + n <= len(self.buf):
            self.at += n
            return
        target = self.pos + n
        self.f.seek(target)
        self.base, self.buf, self.at = target, b"", 0

    def u32(self, what: str) -> int:
        return _U32.unpack(self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack(self.take(8, what))[0]


class _Parser:
    def __init__(self, src: _Source, array_limit: int | None) -> None:
        self.src = src
        self.array_limit = array_limit
        self.kept = 0  # bytes charged to MAX_KEPT
        self.items = 0  # array items seen, against MAX_ITEMS
        self.arrays = 0  # array values seen, against MAX_ARRAYS

    def charge(self, n: int) -> None:
        self.kept += n
        if self.kept > MAX_KEPT:
            raise GGUFFormatError(
                f"the metadata is larger than the {MAX_KEPT / (1 << 20):g} MiB this server reads"
            )

    def length(self, what: str, cap: int, item_size: int) -> int:
        """A u64 count of ``item_size``-byte items, checked against ``cap``
        and against the bytes left."""
        n = self.src.u64(f"the length of {what}")
        if n > cap:
            raise GGUFFormatError(f"{what} has length {n}, more than the {cap} allowed")
        self.src.need(n * item_size, f"{what} (length {n})")
        return n

    def string(self, what: str, cap: int = MAX_STRING) -> str:
        n = self.length(what, cap, 1)
        self.charge(n + _OVERHEAD)
        return self.src.take(n, what).decode("utf-8", errors="replace")

    def value_type(self, what: str) -> int:
        t = self.src.u32(f"the type of {what}")
        if t not in _SCALARS and t not in (STRING, ARRAY):
            raise GGUFFormatError(f"{what} has unknown value type {t}")
        return t

    def value(self, t: int, what: str) -> object:
        """A key's value (kept, unless it is an array past ``array_limit``)."""
        if t == STRING:
            return self.string(what)
        if t == ARRAY:
            return self.array(what, 1, True)
        s = _SCALARS[t]
        self.charge(s.size + _OVERHEAD)
        return s.unpack(self.src.take(s.size, what))[0]

    def array(self, what: str, depth: int, keep: bool) -> object:
        if depth > MAX_NESTING:
            raise GGUFFormatError(f"{what} nests arrays deeper than {MAX_NESTING}")
        self.arrays += 1
        if self.arrays > MAX_ARRAYS:
            raise GGUFFormatError(f"the header has more than {MAX_ARRAYS} arrays")
        t = self.value_type(f"the items of {what}")
        n = self.length(what, MAX_ARRAY, _SCALARS[t].size if t in _SCALARS else _MIN_ITEM[t])
        self.items += n
        if self.items > MAX_ITEMS:
            raise GGUFFormatError(f"the header has more than {MAX_ITEMS} array items")
        keep = keep and (self.array_limit is None or n <= self.array_limit)
        if keep:
            self.charge(_LIST + 8 * n)
        if t in _SCALARS:
            size = _SCALARS[t].size * n
            if not keep:
                self.src.skip(size, what)
                return LongArray(t, n)
            self.charge(size + n * _OVERHEAD)
            return list(struct.unpack(f"<{n}{_SCALARS[t].format[1:]}", self.src.take(size, what)))
        if t == STRING:
            items = self.strings(n, f"an item of {what}", keep)
        else:
            items = [self.array(f"an item of {what}", depth + 1, keep) for _ in range(n)]
        return items if keep else LongArray(t, n)

    def strings(self, n: int, what: str, keep: bool) -> list[str]:
        """``n`` strings: the hot loop of a tokenizer's vocabulary, so a string
        that lies whole in the buffer is read from it directly."""
        src, out, unpack_from = self.src, [], _U64.unpack_from
        for _ in range(n):
            buf, at = src.buf, src.at
            if at + 8 <= len(buf):
                size = unpack_from(buf, at)[0]
                end = at + 8 + size
                if size <= MAX_STRING and end <= len(buf):
                    src.at = end
                    if keep:
                        self.charge(size + _OVERHEAD)
                        out.append(buf[at + 8 : end].decode("utf-8", errors="replace"))
                    continue
            size = src.u64(what)
            if size > MAX_STRING:
                raise GGUFFormatError(f"{what} has length {size}, more than {MAX_STRING}")
            if keep:
                self.charge(size + _OVERHEAD)
                out.append(src.take(size, what).decode("utf-8", errors="replace"))
            else:
                src.skip(size, what)
        return out

    def metadata(self, count: int) -> dict[str, object]:
        out: dict[str, object] = {}
        for i in range(count):
            key = self.string(f"key {i}")
            what = f"key {_quote(key)}"
            if key in out:
                raise GGUFFormatError(f"{what} appears twice")
            out[key] = self.value(self.value_type(what), what)
        return out

    def tensor(self, i: int) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string(f"the name of tensor {i}", MAX_NAME - 1)
        what = f"tensor {name!r}"
        n_dims = self.src.u32(f"the n_dims of {what}")
        if n_dims > MAX_DIMS:
            raise GGUFFormatError(f"{what} has {n_dims} dimensions, more than {MAX_DIMS}")
        self.src.need(8 * n_dims + 12, what)
        dims = struct.unpack(f"<{n_dims}Q", self.src.take(8 * n_dims, what))
        ggml_type = self.src.u32(f"the type of {what}")
        offset = self.src.u64(f"the offset of {what}")
        return name, dims, ggml_type, offset


def _quote(key: str) -> str:
    """A key for an error message (keys may be megabytes long)."""
    return repr(key) if len(key) <= 80 else repr(key[:80]) + "..."


def _tensor_info(
    name: str, dims: tuple[int, ...], ggml_type: int, offset: int, alignment: int, data_size: int
) -> TensorInfo:
    """Size a tensor from its ggml type and check that it lies in the file."""
    sizes = ggml_type_sizes()
    if ggml_type not in sizes:
        raise GGUFFormatError(f"tensor {name!r} has unknown ggml type {ggml_type}")
    block, type_size = sizes[ggml_type]
    n_elements = 1
    for d in dims:
        n_elements *= d
        if d >= 1 << 63 or n_elements >= 1 << 63:
            raise GGUFFormatError(f"tensor {name!r} has too many elements {list(dims)}")
    ne0 = dims[0] if dims else 1
    if ne0 % block:
        raise GGUFFormatError(f"tensor {name!r}: ne[0]={ne0} is not a multiple of {block}")
    n_bytes = n_elements // block * type_size
    if offset % alignment:
        raise GGUFFormatError(f"tensor {name!r} is not aligned to {alignment} bytes")
    if offset + n_bytes > data_size:
        raise GGUFFormatError(f"tensor {name!r} lies past the end of the file")
    return TensorInfo(name, dims, ggml_type, offset, n_elements, n_bytes)


def parse_header(f: BinaryIO, size: int, array_limit: int | None = None) -> GGUFHeader:
    """Parse the header of the ``size``-byte GGUF file ``f`` (positioned at 0).

    Arrays longer than ``array_limit`` items are skipped and kept as a
    ``LongArray``; ``None`` keeps every array (still within ``MAX_KEPT``).
    """
    src = _Source(f, size)
    if src.left < 4 or src.take(4, "the magic") != MAGIC:
        raise GGUFFormatError("not a GGUF file")
    version = src.u32("the version")
    if version & 0xFFFF == 0 and version:
        raise GGUFFormatError("big-endian GGUF files are not supported")
    if version not in VERSIONS:
        raise GGUFFormatError(f"GGUF version {version} is not supported (only 2 and 3)")
    n_tensors = src.u64("the tensor count")
    n_kv = src.u64("the key/value count")
    if n_tensors > MAX_TENSORS:
        raise GGUFFormatError(f"{n_tensors} tensors, more than the {MAX_TENSORS} allowed")
    if n_kv > MAX_KV:
        raise GGUFFormatError(f"{n_kv} key/values, more than the {MAX_KV} allowed")
    # an empty key with a u8 value takes 13 bytes; the smallest tensor info 24
    src.need(n_kv * 13 + n_tensors * 24, f"{n_kv} key/values and {n_tensors} tensors")
    parser = _Parser(src, array_limit)
    metadata = parser.metadata(n_kv)
    raw = [parser.tensor(i) for i in range(n_tensors)]
    header_bytes = src.pos

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool):
        raise GGUFFormatError("general.alignment must be an integer")
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
    data_offset = -(-header_bytes // alignment) * alignment
    data_size = max(size - data_offset, 0)
    tensors, names = [], set()
    for name, dims, ggml_type, offset in raw:
        if name in names:
            raise GGUFFormatError(f"tensor {name!r} appears twice")
        names.add(name)
        tensors.append(_tensor_info(name, dims, ggml_type, offset, alignment, data_size))
    return GGUFHeader(version, metadata, tuple(tensors), alignment, data_offset, header_bytes)


def read_header(path: str | os.PathLike[str], array_limit: int | None = None) -> GGUFHeader:
    """``parse_header`` on a file on disk. Blocking: call it in an executor."""
    with open(path, "rb") as f:
        return parse_header(f, os.fstat(f.fileno()).st_size, array_limit)


def array_length(value: object) -> int | None:
    """Items in an array value (kept or skipped); None for a scalar."""
    if isinstance(value, list | LongArray):
        return len(value)
    return None
