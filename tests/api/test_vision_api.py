"""Images on the server side: request validation, the projector in the store,
create and show, the scheduler's load request, the memory estimate and the
measured allocations. The end-to-end image path is in tests/runner/test_vision_e2e.py."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fakes import FakeRunnerFactory, simulated_environ, synthetic_model
from projector_gguf import write_projector_header
from tornado.httpclient import HTTPClientError

from jupyter_llm.config import Settings
from jupyter_llm.connect.create import find_projector
from jupyter_llm.devices import DeviceSource
from jupyter_llm.memory import EstimateOptions, GpuSlot, estimate, plan_layout
from jupyter_llm.memory.layout import CPU
from jupyter_llm.memory.measured import AllocationLog
from jupyter_llm.memory.projector import ProjectorInfo, projector_graph, read_projector_info
from jupyter_llm.models.modelfile import parse_modelfile
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.models.store import MEDIA_MODEL, MEDIA_PROJECTOR, ModelEntry, ModelStore
from jupyter_llm.request import images
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.messages import parse_messages
from jupyter_llm.scheduler import LoadOptions, Scheduler

MiB, GiB = 1 << 20, 1 << 30
# each format's header, declaring a 2x2 image (what the server reads before any decoding)
PNG = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII5x", 13, b"IHDR", 2, 2)
JPEG = b"\xff\xd8\xff\xe0\x00\x04\x00\x00\xff\xc0" + struct.pack(">HBHHB3x", 11, 8, 2, 2, 1)
GIF = b"GIF89a" + struct.pack("<HH", 2, 2) + b"\0" * 10
BMP = b"BM" + b"\0" * 12 + struct.pack("<Iii", 40, 2, 2) + b"\0" * 8


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- images.py -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "fmt"), [(PNG, "png"), (JPEG, "jpeg"), (GIF, "gif"), (BMP, "bmp")]
)
def test_formats_stb_image_reads_are_accepted(data, fmt):
    assert images.image_format(data) == fmt
    assert images.parse_image(b64(data), "images[0]") == b64(data)


def test_base64_with_line_breaks_is_joined():
    wrapped = b64(PNG)[:8] + "\n" + b64(PNG)[8:]
    assert images.parse_image(wrapped, "images[0]") == b64(PNG)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (5, r"images\[0\] must be a base64 string"),
        ("", "is empty"),
        ("not base64!!", "not valid base64"),
        (b64(PNG)[:-1], "not valid base64"),  # padding cut
        (b64(b"hello, world: text"), r"not an image this server reads \(PNG, JPEG, GIF or BMP\)"),
        (b64(b"RIFF\0\0\0\0WEBPVP8 "), "not an image this server reads"),
        ("data:image/png;base64," + b64(PNG), "not a data: URL"),
    ],
)
def test_bad_images_are_refused(value, match):
    with pytest.raises(ValueError, match=match):
        images.parse_image(value, "images[0]")


def test_an_image_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 64)
    assert images.parse_image(b64(PNG + b"\0" * 30), "i")  # 54 bytes
    with pytest.raises(ValueError, match="larger than"):
        images.parse_image(b64(PNG + b"\0" * 60), "i")
    with pytest.raises(ValueError, match="larger than"):  # refused before decoding
        images.parse_image("A" * 1000, "i")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("abc", "must be a list of base64 strings"),
        ({"a": 1}, "must be a list"),
        ([b64(PNG), 3], r"images\[1\] must be a base64 string"),
        ([b64(PNG)] * (images.MAX_IMAGES + 1), "the limit is 32 images"),
    ],
)
def test_bad_image_lists(raw, match):
    with pytest.raises(ValueError, match=match):
        images.parse_images(raw)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG)}},
        {"type": "image_url", "image_url": "data:image/png;base64," + b64(PNG)},
        {"type": "image_url", "image_url": {"url": "data:;base64," + b64(PNG), "detail": "low"}},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/jpeg;name=x.png;base64," + b64(PNG)},
        },
    ],
)
def test_openai_image_parts(part):
    assert images.parse_image_url(part, "messages[0].content[0]") == b64(PNG)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("https://example.com/cat.png", "does not fetch image URLs"),
        ("http://localhost/cat.png", "does not fetch image URLs"),
        ("file:///etc/passwd", "does not fetch image URLs"),
        ("cat.png", "must be a data: URL"),
        ("data:text/plain;base64," + b64(PNG), "not of an image"),
        ("data:image/png," + b64(PNG), "must be a base64 data: URL"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png;base64," + b64(b"plain text here"), "not an image"),
        (None, "must be a data: URL string"),
    ],
)
def test_bad_openai_image_parts(url, match):
    with pytest.raises(ValueError, match=match):
        images.parse_image_url({"type": "image_url", "image_url": {"url": url}}, "m")


def test_messages_carry_their_images_on_both_apis():
    ollama = parse_messages([{"role": "user", "content": "what?", "images": [b64(PNG)]}])
    assert ollama == [{"role": "user", "content": "what?", "images": [b64(PNG)]}]
    parts = [
        {"type": "text", "text": "what "},
        {"type": "image_url", "image_url": {"url": "data:image/gif;base64," + b64(GIF)}},
        {"type": "text", "text": "is it?"},
    ]
    openai = parse_messages([{"role": "user", "content": parts}], openai=True)
    assert openai == [{"role": "user", "content": "what is it?", "images": [b64(GIF)]}]
    assert "images" not in parse_messages([{"role": "user", "content": "hi", "images": []}])[0]
    with pytest.raises(ValueError, match=r"messages\[0\].images\[0\] is not valid base64"):
        parse_messages([{"role": "user", "content": "x", "images": ["@@"]}])
    with pytest.raises(ValueError, match="only text and image_url parts"):
        parse_messages([{"role": "user", "content": [{"type": "input_audio"}]}], openai=True)
    many = [{"role": "user", "content": "x", "images": [b64(PNG)] * 20}] * 2
    with pytest.raises(ValueError, match="the request has 40 images"):
        parse_messages(many)


# -- the store -------------------------------------------------------------------------
@pytest.fixture
def projector(tmp_path_factory) -> Path:
    return write_projector_header(tmp_path_factory.mktemp("proj") / "mmproj-tiny.gguf")


def vision_store(root: Path, demo_gguf: Path, projector: Path) -> ModelStore:
    store = ModelStore(root)
    files = {
        "mmproj-tiny.gguf": store.add_blob_from_file(projector),
        "tiny.gguf": store.add_blob_from_file(demo_gguf),
    }
    store.create("seer", files)
    return store


def test_create_tells_the_projector_by_its_header(tmp_path, demo_gguf, projector):
    store = vision_store(tmp_path, demo_gguf, projector)
    entry = store.get("seer")
    manifest = json.loads(store.manifest_path(entry.name).read_text())
    assert [la["mediaType"] for la in manifest["layers"]] == [MEDIA_MODEL, MEDIA_PROJECTOR]
    assert entry.projector_path == store.blob_path(manifest["layers"][1]["digest"])
    assert entry.vision and entry.model_path.read_bytes() == demo_gguf.read_bytes()
    assert entry.details["families"] == ["llama", "clip"] and entry.details["family"] == "llama"
    assert not store.create("plain", {"t.gguf": manifest["layers"][0]["digest"]}).vision


def test_from_copy_and_delete_keep_the_projector_consistent(tmp_path, demo_gguf, projector):
    store = vision_store(tmp_path, demo_gguf, projector)
    blob = store.get("seer").projector_path
    assert store.create("terse", from_model="seer", system="be terse").projector_path == blob
    assert store.copy("seer", "seer2").projector_path == blob
    store.delete("seer")
    store.delete("terse")
    assert blob.is_file()  # seer2 still uses it
    removed = store.delete("seer2")
    assert not blob.is_file() and f"sha256:{blob.name[7:]}" in removed


def test_create_refuses_what_is_not_one_model_and_one_projector(tmp_path, demo_gguf, projector):
    store = ModelStore(tmp_path)
    model, proj = store.add_blob_from_file(demo_gguf), store.add_blob_from_file(projector)
    second = store.add_blob_from_file(write_projector_header(tmp_path / "p2.gguf", n_embd=8))
    cases = [
        ({"p.gguf": proj}, "exactly one GGUF model file"),
        ({"a.gguf": model, "b.gguf": model}, "exactly one GGUF model file"),
        ({"p.gguf": proj, "q.gguf": second}, "more than one projector"),
        ({"m.gguf": model, "p.gguf": proj, "q.gguf": second}, "names 3 files: one GGUF model"),
        ({"m.gguf": model, "p.gguf": "sha256:" + "2" * 64}, "has not been uploaded"),
        ({}, "files or from is required"),
    ]
    for files, match in cases:
        with pytest.raises(InvalidRequest, match=match):
            store.create("x", files)
    assert store.list() == []


def test_a_pulled_manifest_with_a_projector_layer(tmp_path, demo_gguf, projector):
    """A manifest as Ollama's registry serves llava: the projector layer is found."""
    store = ModelStore(tmp_path)
    layers = [
        {"mediaType": m, "digest": store.add_blob_from_file(p), "size": p.stat().st_size}
        for m, p in ((MEDIA_MODEL, demo_gguf), (MEDIA_PROJECTOR, projector))
    ]
    config = store.add_blob_bytes(b"{}")
    raw = json.dumps(
        {"schemaVersion": 2, "config": {"digest": config, "size": 2}, "layers": layers}
    )
    entry = store.write_manifest(parse_model_name("llava"), raw.encode())
    assert entry.projector_path == store.blob_path(layers[1]["digest"])


# -- Modelfiles and the mmproj file next to the GGUF -----------------------------------
def test_a_second_from_names_the_projector():
    m = parse_modelfile("FROM ./model.gguf\nFROM ./mmproj-model.gguf\nSYSTEM hi")
    assert m.source == "./model.gguf" and m.more_files == ["./mmproj-model.gguf"]
    with pytest.raises(InvalidRequest, match=r"a second FROM must name a \.gguf file"):
        parse_modelfile("FROM llava\nFROM ./mmproj.gguf")
    with pytest.raises(InvalidRequest, match="a second FROM"):
        parse_modelfile("FROM ./model.gguf\nFROM llava")


@pytest.mark.parametrize(
    ("files", "found"),
    [
        (["m.gguf"], None),
        (["m.gguf", "mmproj-m.gguf"], "mmproj-m.gguf"),
        (["m.gguf", "MMPROJ-M.GGUF", "mmproj-other.gguf"], "MMPROJ-M.GGUF"),
        (["m.gguf", "mmproj-model-f16.gguf"], "mmproj-model-f16.gguf"),  # the only one
        (["m.gguf", "mmproj-a.gguf", "mmproj-b.gguf"], None),  # which? say so with FROM
        (["m.gguf", "mmproj-m.txt"], None),
    ],
)
def test_find_projector(tmp_path, files, found):
    for name in files:
        (tmp_path / name).write_bytes(b"")
    result = find_projector(tmp_path / "m.gguf")
    assert (result.name if result else None) == found


# -- the scheduler's load request --------------------------------------------------------
def test_the_projector_goes_into_the_load_request_and_the_estimate(tmp_path, projector):
    model = synthetic_model(100, 8, n_embd=1024, n_head=8)
    path = tmp_path / "m.gguf"
    entry = ModelEntry(
        name=parse_model_name("seer"),
        digest="d",
        size=1,
        modified_at=datetime.now(UTC),
        model_path=path,
        template=None,
        system=None,
        config={},
        projector_path=projector,
    )
    env = simulated_environ([("gpu0", 24 * GiB, False)], 64 * GiB)
    factory = FakeRunnerFactory()

    async def no_discovery():
        raise AssertionError("simulated devices need no discovery")

    settings = Settings.from_env({}, keep_alive=300.0, num_parallel=1)
    scheduler = Scheduler(
        settings, factory, DeviceSource(no_discovery, environ=env), read_info=lambda p: model
    )

    async def run():
        async with scheduler.use(entry, LoadOptions(num_ctx=2048), None) as lease:
            return lease.loaded

    import asyncio

    loaded = asyncio.run(run())
    assert factory.specs[0].projector == str(projector)
    info = read_projector_info(projector)
    gpu = next(a for a in loaded.allocations if a.device == "gpu0")
    plain = plan_layout(
        estimate(model, EstimateOptions(num_ctx=2048)),
        [GpuSlot("gpu0", "CUDA", 24 * GiB)],
        64 * GiB,
    )
    assert gpu.weights - plain.allocations[0].weights == info.weights_bytes
    assert gpu.graph - plain.allocations[0].graph == projector_graph(info)


# -- the estimate ----------------------------------------------------------------------
def proj(kind: str = "mlp", image: int = 336, patch: int = 14, **kw) -> ProjectorInfo:
    fields = {"n_embd": 1024, "n_ff": 4096, "n_head": 16, "n_layer": 24, "spatial_merge": 0}
    return ProjectorInfo(kind, image, patch, **{**fields, "weights_bytes": 600 * MiB, **kw})


@pytest.mark.parametrize(
    ("info", "positions"),
    [
        (proj(), 24 * 24 + 1),  # llava's CLIP-L/336: 576 patches and the class token
        (proj("gemma3", 896, 14, n_embd=1152, n_ff=4304), 64 * 64 + 1),
        (proj("qwen2.5vl_merger", 560, 14), 46 * 46 * 4),  # warm-up capped, 2x2 merge
        (proj("qwen2vl_merger", 560, 14, spatial_merge=3), 46 * 46 * 9),
        (proj("pixtral", 1024, 16), 256 * 4),
        (proj(patch=0), 1),
    ],
)
def test_warmup_positions(info, positions):
    assert info.warmup_positions == positions


@pytest.mark.parametrize(
    ("info", "low", "high"),
    [  # the attention scores dominate: heads x positions^2 x 4 bytes
        (proj(), 30 * MiB, 60 * MiB),  # llava-1.5's CLIP-L/336 (clip logs about 33 MB)
        (proj("gemma3", 896, 14, n_embd=1152, n_ff=4304), 1000 * MiB, 1300 * MiB),
        (proj(patch=0), 0, 0),
    ],
)
def test_projector_graph(info, low, high):
    assert low <= projector_graph(info) <= high


MODEL = synthetic_model(100, 8, n_embd=1024, n_head=8)


@pytest.mark.parametrize(
    ("gpus", "num_gpu", "where"),
    [
        ([("g0", 24 * GiB)], -1, "g0"),
        ([("g0", 24 * GiB), ("g1", 24 * GiB)], -1, "g0"),
        ([("g0", 24 * GiB)], 0, CPU),  # nothing offloaded: the runner keeps it on the CPU
        ([], -1, CPU),
        # the first GPU is too small for any layer: the projector follows the layers
        ([("g0", 500 * MiB), ("g1", 24 * GiB)], -1, "g1"),
    ],
)
def test_the_projector_is_placed_where_the_runner_loads_it(gpus, num_gpu, where):
    est = estimate(MODEL, EstimateOptions(num_ctx=2048), proj())
    plain = estimate(MODEL, EstimateOptions(num_ctx=2048))
    slots = [GpuSlot(g, "CUDA", free) for g, free in gpus]
    with_proj = plan_layout(est, slots, 64 * GiB, num_gpu=num_gpu)
    without = plan_layout(plain, slots, 64 * GiB, num_gpu=num_gpu)
    extra = {a.device: a.total for a in with_proj.allocations}
    for a in without.allocations:
        extra[a.device] -= a.total
    assert extra == {d: (est.projector_total if d == where else 0) for d in extra}
    assert est.cpu_only_total - plain.cpu_only_total == est.projector_total


def test_the_projector_counts_against_the_first_gpus_room():
    est = estimate(MODEL, EstimateOptions(num_ctx=2048), proj(weights_bytes=4 * GiB))
    plain = estimate(MODEL, EstimateOptions(num_ctx=2048))
    free = plain.cpu_only_total - plain.input_weights + 457 * MiB + 1  # just fits without it
    slot = [GpuSlot("g0", "CUDA", free)]
    assert plan_layout(plain, slot, 64 * GiB).n_gpu_layers == plain.n_layer + 1
    assert plan_layout(est, slot, 64 * GiB).n_gpu_layers < plain.n_layer + 1


# -- what clip logs --------------------------------------------------------------------
def test_clip_buffers_join_the_measured_allocations():
    log = AllocationLog()
    for line in [
        "load_tensors:        CUDA0 model buffer size =    10.00 MiB",
        "print_info: model size       = 10.00 MiB (8.00 BPW)",  # llama's own: not clip's
        "clip_ctx: CLIP using CUDA0 backend",
        "load_hparams: model size:         3.00 MiB",
        "reserve_compute_meta:      CUDA0 compute buffer size =     8.00 MiB",
        "reserve_compute_meta:        CPU compute buffer size =     1.00 MiB",
        "warmup: flash attention not supported by CUDA0, memory usage will increase",
        "reserve_compute_meta:      CUDA0 compute buffer size =    12.00 MiB",  # again: replaces
        "reserve_compute_meta:        CPU compute buffer size =     1.00 MiB",
    ]:
        log.feed(line)
    assert log.devices["CUDA0"] == {"weights": 13 * MiB, "kv_cache": 0, "graph": 12 * MiB}
    assert log.devices[CPU] == {"weights": 0, "kv_cache": 0, "graph": 1 * MiB}
    log.reset()
    log.feed("load_hparams: model size:         3.00 MiB")  # no clip backend named yet
    log.feed("clip_ctx: CLIP using CPU backend")
    log.feed("load_hparams: model size:         2.00 MiB")
    assert log.devices == {CPU: {"weights": 2 * MiB, "kv_cache": 0, "graph": 0}}


# -- the API ---------------------------------------------------------------------------
@pytest.fixture
def vision_model(models_dir: Path, demo_gguf: Path, projector: Path, installed_model) -> str:
    vision_store(models_dir, demo_gguf, projector)
    return "seer:latest"


async def post(jp_fetch, path: str, body: dict) -> dict:
    r = await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def refused(jp_fetch, path: str, body: dict) -> str:
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    assert e.value.code == 400
    reply = json.loads(e.value.response.body)
    return reply["error"] if isinstance(reply["error"], str) else reply["error"]["message"]


async def test_show_reports_vision_and_the_projector(jp_fetch, vision_model, projector):
    shown = await post(jp_fetch, "api/show", {"model": "seer"})
    assert "vision" in shown["capabilities"] and "completion" in shown["capabilities"]
    info = shown["projector_info"]
    assert info["general.architecture"] == "clip" and info["clip.vision.image_size"] == 32
    assert info["general.parameter_count"] == 1024
    assert [line[:5] for line in shown["modelfile"].splitlines()].count("FROM ") == 2
    plain = await post(jp_fetch, "api/show", {"model": "tiny"})
    assert "vision" not in plain["capabilities"] and "projector_info" not in plain
    tags = await jp_fetch("llm", "api", "tags")
    families = {m["name"]: m["details"]["families"] for m in json.loads(tags.body)["models"]}
    assert families["seer:latest"] == ["llama", "clip"]


IMAGE = b64(PNG)
DATA_URL = "data:image/png;base64," + IMAGE


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("api/generate", {"prompt": "what is this?", "images": [IMAGE]}),
        ("api/generate", {"prompt": "what?", "images": [IMAGE], "raw": True}),
        ("api/chat", {"messages": [{"role": "user", "content": "what?", "images": [IMAGE]}]}),
        (
            "v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what?"},
                            {"type": "image_url", "image_url": {"url": DATA_URL}},
                        ],
                    }
                ]
            },
        ),
    ],
)
async def test_a_text_model_refuses_images(jp_fetch, installed_model, path, body):
    message = await refused(jp_fetch, path, {"model": "tiny", "stream": False, **body})
    assert message == "model 'tiny:latest' does not support images"


@pytest.mark.parametrize(
    ("path", "body", "match"),
    [
        ("api/generate", {"prompt": "x", "images": "abc"}, "images must be a list"),
        ("api/generate", {"prompt": "x", "images": ["%%%"]}, r"images\[0\] is not valid base64"),
        ("api/generate", {"prompt": "x", "images": [b64(b"text")]}, "not an image"),
        ("api/generate", {"prompt": "x", "images": [DATA_URL]}, "not a data: URL"),
        (
            "api/chat",
            {"messages": [{"role": "user", "content": "x", "images": [7]}]},
            r"messages\[0\].images\[0\] must be a base64 string",
        ),
        (
            "v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
                        ],
                    }
                ]
            },
            "this server does not fetch image URLs",
        ),
        (
            "v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,!"}}
                        ],
                    }
                ]
            },
            "not valid base64",
        ),
    ],
)
async def test_bad_images_are_a_400(jp_fetch, vision_model, path, body, match):
    import re

    message = await refused(jp_fetch, path, {"model": "seer", "stream": False, **body})
    assert re.search(match, message), message


def test_jupyter_llm_create_takes_the_projector_next_to_the_gguf(tmp_path, demo_gguf):
    """The client uploads ``mmproj-<stem>.gguf`` beside the GGUF, or the one a
    second FROM names; the server tells which is the projector."""
    import subprocess
    import sys

    from live_server import LiveServer

    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "seer.gguf").write_bytes(demo_gguf.read_bytes())
    write_projector_header(folder / "mmproj-seer.gguf")
    write_projector_header(folder / "mmproj-other.gguf", n_embd=8)
    models = tmp_path / "models"
    server = LiveServer(models, tmp_path)
    try:

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "jupyter_llm.cli", *args],
                env=server.client_env,
                capture_output=True,
                text=True,
                timeout=180,
                cwd=folder,
            )

        out = cli("create", "next", "-f", "seer.gguf")
        assert out.returncode == 0 and "using projector mmproj-seer.gguf" in out.stderr, out.stderr
        (folder / "Modelfile").write_text("FROM ./seer.gguf\nFROM ./mmproj-other.gguf\n")
        assert cli("create", "named", "-f", "Modelfile").returncode == 0
        (folder / "mmproj-seer.gguf").unlink()
        write_projector_header(folder / "mmproj-third.gguf")  # two, neither named for seer
        out = cli("create", "none", "-f", "seer.gguf")
        assert out.returncode == 0 and "projector" not in out.stderr
        store = ModelStore(models)
        shown = {
            name: read_projector_info(p) if (p := store.get(name).projector_path) else None
            for name in ("next", "named", "none")
        }
        assert shown["next"].n_embd == 16 and shown["named"].n_embd == 8
        assert shown["none"] is None
    finally:
        server.stop()


# -- pulls -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["m.Q4_K_M.gguf"], None),
        (["m.Q4_K_M.gguf", "mmproj-m-f16.gguf"], "mmproj-m-f16.gguf"),
        (["mmproj-F32.gguf", "mmproj-BF16.gguf", "mmproj-F16.gguf"], "mmproj-F16.gguf"),
        (["mmproj-model-f32.gguf", "mmproj-model-bf16.gguf"], "mmproj-model-bf16.gguf"),
        (["mmproj-x-long.gguf", "mmproj-x.gguf"], "mmproj-x.gguf"),
        (["mmproj-notes.txt"], None),
    ],
)
def test_pick_projector(names, chosen):
    from jupyter_llm.models.pull import pick_projector

    found = pick_projector([{"rfilename": n} for n in names])
    assert (found[0] if found else None) == chosen


async def test_a_hugging_face_pull_takes_the_repos_projector(
    jp_fetch, jp_serverapp, server, remote, demo_gguf, projector
):
    from loopback import pull_events

    remote.hf_repos["someone/Seer-GGUF"] = {
        "seer.Q4_K_M.gguf": demo_gguf.read_bytes(),
        "mmproj-seer-f16.gguf": projector.read_bytes(),
        "mmproj-seer-f32.gguf": write_projector_header(projector.parent / "f32.gguf").read_bytes(),
    }
    jp_serverapp.web_app.settings["jupyter_llm"].puller.hf_endpoint = server.base
    events = await pull_events(jp_fetch, {"model": "hf.co/someone/Seer-GGUF"}, timeout=120)
    assert events[-1] == {"status": "success"}, events
    shown = await post(jp_fetch, "api/show", {"model": "hf.co/someone/Seer-GGUF:Q4_K_M"})
    assert "vision" in shown["capabilities"]
    assert shown["projector_info"]["general.architecture"] == "clip"


async def test_a_models_message_images_count_with_the_requests(jp_fetch, vision_model):
    """A model's MESSAGE history may hold images (checked when it was
    created); they go to the runner with the request's, so the two together
    stay within the request's bounds: each alone did, and a model of 32
    images took 32 more from every request."""
    from jupyter_llm.request.limits import IMAGES

    half = IMAGES.value // 2 + 1
    history = [{"role": "user", "content": "look", "images": [b64(PNG)] * half}]
    body = {"model": "album", "from": vision_model, "messages": history, "stream": False}
    await post(jp_fetch, "api/create", body)
    ask = {"role": "user", "content": "and these?", "images": [b64(PNG)] * half}
    message = await refused(jp_fetch, "api/chat", {"model": "album", "messages": [ask]})
    assert f"the request has {2 * half} images" in message


def test_a_models_message_images_are_measured_once_per_manifest(monkeypatch):
    """The store keeps a model's MESSAGE images as text: they are decoded
    to be measured once per manifest, not at every request (32 images of
    20 MiB are 640 MiB of base64), and still count at every request."""
    from jupyter_llm.request import images
    from jupyter_llm.request.limits import IMAGES

    decoded: list[str] = []
    real = images.parse_image
    monkeypatch.setattr(
        images, "parse_image", lambda value, field: decoded.append(value) or real(value, field)
    )
    held = [b64(PNG)] * 3
    for _ in range(3):
        images.check_with_model_images("sha256:album", held, [])
    assert len(decoded) == 3
    too_many = [images.parse_image(b64(PNG), "x")] * (IMAGES.value - 2)
    with pytest.raises(ValueError, match=f"the request has {IMAGES.value + 1} images"):
        images.check_with_model_images("sha256:album", held, too_many)
