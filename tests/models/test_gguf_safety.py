"""Hostile GGUF headers: refused quickly, with a clear error, without
allocating; valid files read exactly as the ``gguf`` package reads them."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import random
import re
import resource
import struct
import threading
import tracemalloc
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.models import gguf_header
from jupyter_llm.models.gguf_header import (
    ARRAY,
    STRING,
    UINT8,
    GGUFFormatError,
    GGUFHeader,
    LongArray,
    parse_header,
    read_header,
)
from jupyter_llm.models.gguf_info import read_gguf_info, read_metadata
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import InvalidRequest

MEMORY_BOUND = 50 << 20


# -- building headers by hand ------------------------------------------------------


def gguf_string(s: str | bytes) -> bytes:
    data = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(data)) + data


def header(kvs: Sequence[bytes], tensors: Sequence[bytes] = (), version: int = 3) -> bytes:
    return (
        b"GGUF"
        + struct.pack("<IQQ", version, len(tensors), len(kvs))
        + b"".join(kvs)
        + b"".join(tensors)
    )


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", 4, value)


def kv_str(key: str, value: str) -> bytes:
    return gguf_string(key) + struct.pack("<I", STRING) + gguf_string(value)


def attack_49() -> bytes:
    """The reported attack: a UINT8 array that claims 2^63 items."""
    data = header([gguf_string("a") + struct.pack("<IIQ", ARRAY, UINT8, 1 << 63)])
    assert len(data) == 49
    return data


def huge_blocks() -> bytes:
    """A well-formed header whose block_count would size a 2^31-item list."""
    return header([kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 1 << 31)])


ATTACKS = {  # name: (file, what the error says)
    "uint8 array of 2^63": (attack_49(), "'a' has length 9223372036854775808, more than"),
    "string array of 2^63": (
        header([gguf_string("a") + struct.pack("<IIQ", ARRAY, STRING, 1 << 63)]),
        "'a' has length 9223372036854775808, more than",
    ),
    "string array of 2^20": (
        header([gguf_string("a") + struct.pack("<IIQ", ARRAY, STRING, 1 << 20) + bytes(64)]),
        "needs 8388608 bytes but only 64 are left",
    ),
    "string of 2^63 bytes": (
        header([gguf_string("a") + struct.pack("<IQ", STRING, 1 << 63)]),
        "'a' has length 9223372036854775808, more than",
    ),
    "key of 2^64-1 bytes": (
        header([struct.pack("<Q", (1 << 64) - 1) + bytes(64)]),
        "key 0 has length 18446744073709551615",
    ),
    "2^63 key/values": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 63), "key/values, more than"),
    "2^63 tensors": (b"GGUF" + struct.pack("<IQQ", 3, 1 << 63, 0), "tensors, more than"),
    "deep nesting": (
        header([gguf_string("a") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 64]),
        "nests arrays deeper than 3",
    ),
    "70000 empty arrays in an array": (
        header(
            [
                gguf_string("a")
                + struct.pack("<IIQ", ARRAY, ARRAY, 70000)
                + struct.pack("<IQ", UINT8, 0) * 70000
            ]
        ),
        "more than 65536 arrays",
    ),
    "tensor of 2^64 elements": (
        header(
            [],
            [gguf_string("t") + struct.pack("<I4QIQ", 4, 1 << 16, 1 << 16, 1 << 16, 1 << 16, 0, 0)],
        ),
        "tensor 't' has too many elements",
    ),
    "tensor with 2^32-1 dims": (
        header([], [gguf_string("t") + struct.pack("<I", (1 << 32) - 1) + bytes(64)]),
        "tensor 't' has 4294967295 dimensions, more than 4",
    ),
    "architecture of 1 MiB": (
        header([kv_str("general.architecture", "x" * (1 << 20))]),
        "general.architecture is too long",
    ),
    "block_count 2^31": (huge_blocks(), "llama.block_count is 2147483648, outside 0..4096"),
}


class Counting(io.BytesIO):
    """A file that counts the bytes handed out."""

    bytes_read = 0

    def read(self, n: int | None = -1) -> bytes:
        out = super().read(n)
        self.bytes_read += len(out)
        return out


def parse(data: bytes, array_limit: int | None = None) -> GGUFHeader:
    f = Counting(data)
    try:
        return parse_header(f, len(data), array_limit)
    finally:
        assert f.bytes_read <= len(data)


def peak_growth(fn) -> tuple[int, int]:
    """(tracemalloc peak, ru_maxrss growth) in bytes while ``fn`` runs."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) * 1024


# -- (a), (b): the reported attacks --------------------------------------------------


def refused(read, path: Path, match: str) -> None:
    with pytest.raises(
        InvalidRequest, match=re.escape("invalid model file: ") + ".*" + re.escape(match)
    ):
        read(path)


@pytest.fixture
def attack_file(tmp_path: Path) -> Path:
    path = tmp_path / "attack.gguf"
    path.write_bytes(attack_49())
    return path


@pytest.mark.parametrize(
    "read",
    [read_gguf_info, read_model_info, read_metadata, lambda p: read_metadata(p, verbose=True)],
    ids=["info", "model_info", "show", "show-verbose"],
)
def test_49_byte_attack_refused_without_allocating(attack_file, read):
    # a refusal, not a loop over 2**63 entries: it returns at all (within a
    # deadline far beyond any machine's speed) and allocates almost nothing
    pool = ThreadPoolExecutor(1)
    growth = pool.submit(
        peak_growth, lambda: refused(read, attack_file, "length 9223372036854775808")
    )
    try:
        traced, rss = growth.result(timeout=60)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    assert traced < MEMORY_BOUND and rss < MEMORY_BOUND


def test_49_byte_attack_refused_by_create(tmp_path, attack_file):
    store = ModelStore(tmp_path / "models")
    digest = store.add_blob_from_file(attack_file)

    def attempt():
        with pytest.raises(InvalidRequest, match="invalid model file: "):
            store.create("evil", {"a.gguf": digest})

    traced, rss = peak_growth(attempt)
    assert traced < MEMORY_BOUND and rss < MEMORY_BOUND
    assert store.list() == []


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attacks_refused_with_a_clear_error(name, tmp_path):
    data, match = ATTACKS[name]
    path = tmp_path / "a.gguf"
    path.write_bytes(data)
    for read in (read_gguf_info, read_model_info):
        traced, _ = peak_growth(lambda read=read: refused(read, path, match))
        assert traced < MEMORY_BOUND


def test_per_layer_values_capped(tmp_path):
    path = tmp_path / "heads.gguf"
    kv_array = gguf_string("llama.attention.head_count") + struct.pack("<IIQ", ARRAY, 4, 2)
    path.write_bytes(
        header([kv_str("general.architecture", "llama"), kv_array + struct.pack("<II", 8, 1 << 30)])
    )
    with pytest.raises(InvalidRequest, match="head_count is 1073741824"):
        read_model_info(path)
    many = gguf_string("llama.attention.head_count_kv") + struct.pack("<IIQ", ARRAY, 4, 5000)
    path.write_bytes(header([many + bytes(4 * 5000)]))
    with pytest.raises(InvalidRequest, match="head_count_kv has 5000 values"):
        read_model_info(path)


def test_metadata_kept_in_memory_is_capped(demo_gguf, monkeypatch):
    data = demo_gguf.read_bytes()
    monkeypatch.setattr(gguf_header, "MAX_KEPT", 8 << 10)
    assert parse(data, array_limit=32).metadata["tokenizer.ggml.tokens"] == LongArray(STRING, 265)
    with pytest.raises(GGUFFormatError, match=r"metadata is larger than the 0\.0078125 MiB"):
        parse(data)  # every token kept: more than 8 KiB


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"GGUX" + bytes(20), "not a GGUF file"),
        (b"GGU", "not a GGUF file"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1 is not supported"),
        (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
        (header([gguf_string("a") + struct.pack("<II", 13, 0)]), "unknown value type 13"),
        (header([kv_u32("a", 1), kv_u32("a", 2)]), "'a' appears twice"),
        (
            header([], [gguf_string("t") + struct.pack("<IQIQ", 1, 32, 99, 0)]),
            "unknown ggml type 99",
        ),
        (
            header([], [gguf_string("t") + struct.pack("<IQIQ", 1, 31, 8, 0)]),
            "not a multiple of 32",
        ),
        (header([], [gguf_string("t") + struct.pack("<IQIQ", 1, 4, 0, 0)]), "past the end"),
        (header([], [gguf_string("t" * 64)]), "more than the 63 allowed"),
        (header([kv_u32("general.alignment", 3)]), "not a power of two"),
    ],
)
def test_malformed_headers(data, match):
    with pytest.raises(GGUFFormatError, match=match):
        parse(data)


# -- (c): fuzzing the demo model's header --------------------------------------------


def length_like_offsets(data: bytes, end: int) -> list[int]:
    """Offsets of u64 values that look like a count, a length, a dim or an offset."""
    return [p for p in range(end - 8) if 0 < struct.unpack_from("<Q", data, p)[0] < 1 << 20]


HUGE = [1 << 63, (1 << 64) - 1, 1 << 32, (1 << 31) + 1, 1 << 40, 0]


def mutants(data: bytes, end: int, n: int, seed: int = 20240611):
    rng = random.Random(seed)
    lengths = length_like_offsets(data, end)
    for i in range(n):
        m = bytearray(data)
        kind = i % 5
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                m[rng.randrange(end)] = rng.randrange(256)
        elif kind in (1, 2):
            p = rng.choice(lengths)
            old = struct.unpack_from("<Q", m, p)[0]
            new = rng.choice([*HUGE, old + 1, old * 1000, len(data), rng.getrandbits(64)])
            struct.pack_into("<Q", m, p, new)
        elif kind == 3:
            p = rng.choice(lengths)
            struct.pack_into(
                "<I", m, p, rng.choice([0, 9, 12, 13, 99, (1 << 32) - 1, rng.getrandbits(32)])
            )
        else:
            p = rng.choice(lengths)
            struct.pack_into("<Q", m, p, rng.choice(HUGE))
            del m[rng.randrange(len(m) if rng.random() < 0.5 else end) :]
        yield bytes(m)


def test_fuzzed_headers_parse_or_are_refused(tmp_path):
    data = write_demo_model(tmp_path / "demo.gguf").read_bytes()
    end = read_header(tmp_path / "demo.gguf").header_bytes
    outcomes = {"parsed": 0, "refused": 0}
    path = tmp_path / "m.gguf"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        for i, m in enumerate(mutants(data, end, 600)):
            try:
                h = parse(m, (0, 32, None)[i % 3])
                assert h.header_bytes <= h.data_offset <= len(m) + h.alignment
                outcomes["parsed"] += 1
            except GGUFFormatError:
                outcomes["refused"] += 1
            path.write_bytes(m)
            for read in (read_gguf_info, read_model_info, read_metadata):
                try:
                    read(path)
                except InvalidRequest as e:
                    assert str(e).startswith("invalid model file: "), str(e)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) * 1024 < MEMORY_BOUND
    assert outcomes["parsed"] > 20 and outcomes["refused"] > 200, outcomes


# -- valid files read as GGUFReader reads them ---------------------------------------


def reference_metadata(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def reference_layers(path: Path, n_layer: int) -> tuple[int, ...]:
    layers = [0] * n_layer
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name.startswith("blk."):
            layers[int(t.name.split(".")[1])] += int(t.n_bytes)
    return tuple(layers)


def kitchen_sink(path: Path) -> Path:
    """Every value type, and tensors of several ggml types and ranks."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.data_alignment = 64
    w.add_custom_alignment(64)
    w.add_block_count(3)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", (1 << 64) - 1)
    w.add_int64("t.i64", -(1 << 63))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.yes", True)
    w.add_bool("t.no", False)
    w.add_string("t.text", "héllo ✓ " * 1000)
    w.add_string("t.empty", "")
    for vtype in (0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12):
        values = [True, False] * 20 if vtype == 7 else list(range(40))
        w.add_key_value(
            f"t.array{vtype}", values, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(vtype)
        )
    w.add_array("t.strings", [f"s{i}" for i in range(100)])
    w.add_array("t.short", ["a", "b"])
    w.add_key_value(
        "llama.attention.head_count_kv",
        [2, 4, 1],
        gguf.GGUFValueType.ARRAY,
        gguf.GGUFValueType.INT32,
    )
    w.add_head_count(8)
    w.add_embedding_length(256)
    q = gguf.GGMLQuantizationType
    w.add_tensor("token_embd.weight", np.zeros((10, 256), dtype=np.float16))
    w.add_tensor("blk.0.a.weight", np.zeros((4, 34), dtype=np.uint8), raw_dtype=q.Q8_0)
    w.add_tensor("blk.1.b.weight", np.zeros((2, 144), dtype=np.uint8), raw_dtype=q.Q4_K)
    w.add_tensor("blk.2.c.weight", np.zeros((2, 3, 4, 5), dtype=np.float32))
    w.add_tensor("blk.2.d.weight", np.zeros(7, dtype=np.int32))
    w.add_tensor("output.weight", np.zeros((3, 64), dtype=np.uint8), raw_dtype=q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SHAPES = [
    DemoModelSpec(),
    DemoModelSpec(n_embd=32, n_layer=1, n_ff=48, n_head=2, n_head_kv=1),
    DemoModelSpec(n_embd=96, n_layer=5, n_ff=64, n_head=6, n_head_kv=3, context_length=512),
    DemoModelSpec(n_embd=16, n_layer=12, n_ff=16, n_head=4, n_head_kv=4, name="ünïcode"),
]


@pytest.mark.parametrize("shape", [*range(len(SHAPES)), "kitchen-sink"])
def test_valid_files_read_as_gguf_reader_reads_them(tmp_path, shape):
    if shape == "kitchen-sink":
        path = kitchen_sink(tmp_path / "k.gguf")
    else:
        path = write_demo_model(tmp_path / "m.gguf", SHAPES[shape])
    reader = gguf.GGUFReader(str(path))
    ref = reference_metadata(path)
    h = read_header(path)
    assert h.metadata == ref and list(h.metadata) == list(ref)
    assert h.data_offset == reader.data_offset
    assert [(t.name, list(t.dims), t.ggml_type, t.n_elements, t.n_bytes) for t in h.tensors] == [
        (t.name, t.shape.tolist(), int(t.tensor_type), int(t.n_elements), int(t.n_bytes))
        for t in reader.tensors
    ]
    assert [h.data_offset + t.offset for t in h.tensors] == [t.data_offset for t in reader.tensors]
    n_params = sum(int(t.n_elements) for t in reader.tensors)

    short = {k: None if isinstance(v, list) and len(v) > 32 else v for k, v in ref.items()}
    assert read_metadata(path) == {**short, "general.parameter_count": n_params}
    assert read_metadata(path, verbose=True) == {**ref, "general.parameter_count": n_params}
    assert read_gguf_info(path).parameter_count == n_params

    info = read_model_info(path)
    assert info.layer_bytes == reference_layers(path, int(ref["llama.block_count"]))
    assert info.n_vocab == len(ref.get("tokenizer.ggml.tokens", []))
    if shape == "kitchen-sink":
        assert (info.n_head, info.n_head_kv, info.head_dim_k) == (8, 4, 32)
        assert info.output_bytes == 3 * 64 and info.input_bytes == 10 * 256 * 2


def test_long_arrays_are_kept_as_their_length(demo_gguf):
    h = read_header(demo_gguf, array_limit=32)
    assert h.metadata["tokenizer.ggml.tokens"] == LongArray(STRING, 265)
    assert len(h.metadata["tokenizer.ggml.token_type"]) == 265
    assert h.metadata["tokenizer.ggml.merges"] == ["h e", "Ġ t"]


def test_nested_arrays_keep_their_shape(tmp_path):
    path = tmp_path / "n.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("t.nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY)
    w.add_key_value("t.words", [["a"], ["b", "c"]], gguf.GGUFValueType.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    meta = read_header(path).metadata
    # GGUFReader flattens these ([1, 2, 3]); the file holds lists of lists
    assert meta["t.nested"] == [[1, 2], [3]] and meta["t.words"] == [["a"], ["b", "c"]]


# -- (d): through the real server -----------------------------------------------------


async def upload(jp_fetch, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = await jp_fetch("llm", "api", "blobs", digest, method="POST", body=data)
    assert r.code == 201
    return digest


async def create(jp_fetch, name: str, digest: str) -> HTTPClientError:
    body = json.dumps({"model": name, "files": {"m.gguf": digest}})
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "create", method="POST", body=body)
    return info.value


async def test_server_refuses_hostile_uploads_and_stays_responsive(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, monkeypatch
):
    from jupyter_llm.models import gguf_info

    readers: set[int] = set()  # the threads that parsed a header
    real_read = gguf_info.read_header

    def reading(*args, **kwargs):
        readers.add(threading.get_ident())
        return real_read(*args, **kwargs)

    monkeypatch.setattr(gguf_info, "read_header", reading)
    digests = {name: await upload(jp_fetch, data) for name, (data, _) in ATTACKS.items()}
    other = AsyncHTTPClient(force_instance=True)
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/tags"
    auth = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}
    answers: list[bytes] = []
    done = asyncio.Event()

    async def poll_tags():
        while not done.is_set():
            r = await other.fetch(url, headers=auth, request_timeout=10)
            answers.append(r.body)
            assert json.loads(r.body)["models"] == []
            await asyncio.sleep(0.01)

    poller = asyncio.ensure_future(poll_tags())
    served: list[int] = []  # tags answers seen by the end of each round of the attack
    try:
        for _ in range(3):  # the attack, repeated, several uploads at once
            errors = await asyncio.gather(
                *(create(jp_fetch, f"evil{i}", d) for i, d in enumerate(digests.values()))
            )
            for name, e in zip(digests, errors, strict=True):
                assert e.code == 400, name
                assert json.loads(e.response.body)["error"].startswith("invalid model file: "), name
            served.append(len(answers))
    finally:
        done.set()
        await poller
    # the loop kept answering while the hostile files were checked (no timed bound:
    # each poll has its own 10 s deadline, and the answers must keep coming)
    assert served[-1] > 0, served
    assert readers and threading.get_ident() not in readers  # never on the server's loop


def foreign_model(models_dir: Path, name: str, data: bytes) -> None:
    """A manifest written by another tool sharing the store (no create-time check)."""
    store = ModelStore(models_dir)
    blob = store.add_blob_bytes(data)
    config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": store.add_blob_bytes(config),
            "size": len(config),
        },
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": blob, "size": len(data)}
        ],
    }
    from jupyter_llm.models.names import parse_model_name

    store.write_manifest(parse_model_name(name), json.dumps(manifest).encode())


@pytest.mark.parametrize("attack", ["uint8 array of 2^63", "block_count 2^31"])
async def test_show_and_load_refuse_foreign_hostile_files(jp_fetch, models_dir, attack):
    foreign_model(models_dir, "foreign", ATTACKS[attack][0])
    for path, body in [
        ("show", {"model": "foreign", "verbose": True}),
        ("generate", {"model": "foreign", "prompt": "hi", "stream": False}),
    ]:
        if path == "show" and attack == "block_count 2^31":
            continue  # show only lists the metadata: nothing is sized by block_count
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("llm", "api", path, method="POST", body=json.dumps(body))
        assert info.value.code == 400, path
        assert json.loads(info.value.response.body)["error"].startswith("invalid model file: ")
