"""Attack 4: a 17 KB PNG declaring 12288x12288 pixels at 1 bit was answered
200 and grew the runner by 866 MiB. The server now reads each image's size
from its header before anything is decoded (PNG IHDR, JPEG SOF, GIF, BMP),
and bounds pixels per side, per image and per request."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from pathlib import Path

import pytest
from harness import MAX_RSS_GROWTH, rss, rss_growth, runner_pids
from PIL import Image

from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.images import image_size
from jupyter_llm.request.limits import IMAGE_PIXELS, IMAGE_SIDE, REQUEST_PIXELS


def bilevel_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of any size in a few KB: rows of zeros compress away."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\0" * (1 + (width + 7) // 8)  # filter byte, then the bits
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )


def pil_image(fmt: str, width: int, height: int, **save) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, fmt, **save)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP"])
@pytest.mark.parametrize(("width", "height"), [(1, 1), (640, 480), (33, 1017)])
def test_the_header_says_the_size_pil_decodes(fmt, width, height):
    assert image_size(pil_image(fmt, width, height)) == (width, height)


def test_a_jpeg_size_is_found_after_large_metadata_segments():
    icc = b"\0" * 60_000  # an ICC profile segment before the frame
    data = pil_image("JPEG", 300, 200, icc_profile=icc)
    assert image_size(data) == (300, 200)


def test_a_jpeg_of_endless_empty_segments_is_not_walked_to_its_end():
    """5M empty segments (20 MiB) before the frame were walked in Python
    for 3.7 s on the event loop (``/api/create``'s messages); the walk stops
    after ``JPEG_SEGMENTS``, so the header does not say the size."""
    from jupyter_llm.request.images import JPEG_SEGMENTS

    frame = b"\xff\xc0\x00\x11\x08" + struct.pack(">HH", 64, 64) + b"\0" * 10
    few = b"\xff\xd8" + b"\xff\xe0\x00\x02" * (JPEG_SEGMENTS // 2) + frame
    assert image_size(few) == (64, 64)
    endless = b"\xff\xd8" + b"\xff\xe0\x00\x02" * 5_000_000 + frame
    assert image_size(endless) is None
    fill = b"\xff\xd8" + b"\xff" * 5_000_000 + frame  # fill bytes count too
    assert image_size(fill) is None


@pytest.mark.parametrize(
    "data",
    [b"\xff\xd8\xff\xda", b"\xff\xd8\xff\xe0\x00", b"\x89PNG\r\n\x1a\n", b"GIF8", b"BM"],
    ids=["scan before frame", "cut segment", "no IHDR", "short GIF", "short BMP"],
)
def test_unreadable_headers_have_no_size(data):
    assert image_size(data) is None


def test_the_attack_png_is_small():
    assert len(bilevel_png(12288, 12288)) < 40_000


def chat(*images: bytes, model: str = "tiny") -> dict:
    message = {
        "role": "user",
        "content": "what is this?",
        "images": [base64.b64encode(i).decode() for i in images],
    }
    return {
        "model": model,
        "messages": [message],
        "stream": False,
        "options": {"num_predict": 2, "temperature": 0},
    }


@pytest.mark.parametrize(
    ("images", "limit"),
    [
        ((bilevel_png(12288, 12288),), IMAGE_SIDE.key),
        ((bilevel_png(6000, 6000),), IMAGE_PIXELS.key),
        ((bilevel_png(5000, 5000),) * 3, REQUEST_PIXELS.key),
    ],
    ids=["the attack", "36 megapixels", "three of 25"],
)
async def test_images_past_a_pixel_bound_are_a_400_naming_it(users, installed_model, images, limit):
    attacker, _ = users
    status, answer = await attacker.json("api/chat", chat(*images))
    assert status == 400, answer
    assert limit in json.dumps(answer), answer
    openai_body = {
        "model": "tiny",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": "data:image/png;base64," + base64.b64encode(i).decode()
                        },
                    }
                    for i in images
                ],
            }
        ],
    }
    status, answer = await attacker.json("v1/chat/completions", openai_body)
    assert status == 400, answer
    assert limit in json.dumps(answer), answer


@pytest.fixture
def vision_model(models_dir: Path, tmp_path: Path, installed_model) -> str:
    from jupyter_llm.demo import write_vision_model

    store = ModelStore(models_dir)
    files = write_vision_model(tmp_path, "tiny-vision")
    store.create("seer", {p.name: store.add_blob_from_file(p) for p in files})
    return "seer"


async def test_an_image_at_the_pixel_limit_leaves_the_runner_its_memory(
    users, vision_model, jp_serverapp
):
    attacker, _ = users
    side = int(IMAGE_PIXELS.value**0.5)  # 5792 x 5792: just within
    largest = bilevel_png(side, side)
    status, answer = await attacker.json("api/chat", chat(bilevel_png(8, 8), model="seer"))
    assert status == 200, answer
    (pid,) = runner_pids(jp_serverapp)
    before = rss(pid)
    status, answer = await attacker.json("api/chat", chat(largest, model="seer"))
    assert status == 200, answer
    assert runner_pids(jp_serverapp) == [pid]
    assert rss_growth(pid, before) < MAX_RSS_GROWTH
