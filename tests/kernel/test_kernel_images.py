"""Notebook values as images (``jupyter_llm.kernel.image_inputs``): what each kind
of value becomes, and a clear error for everything else. Pure: no server."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib
import pytest
from PIL import Image

from jupyter_llm.kernel.batch import Item, request_body, to_items
from jupyter_llm.kernel.image_inputs import (
    ImageValueError,
    image_base64,
    image_bytes,
    image_url,
    images_base64,
    images_from_namespace,
)
from jupyter_llm.kernel.magics import parse_cell_args
from jupyter_llm.request.images import image_format

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def pil(mode: str = "RGB", size: tuple[int, int] = (6, 4)) -> Image.Image:
    return Image.new(
        mode,
        size,
        128 if len(mode) == 1 or mode.startswith("I") else (200, 30, 30, 255)[: len(mode)],
    )


def jpeg_bytes() -> bytes:
    buffer = io.BytesIO()
    pil().save(buffer, format="JPEG")
    return buffer.getvalue()


def figure() -> object:
    fig, ax = plt.subplots(figsize=(2, 1.5), dpi=50)
    ax.plot([0, 1, 2], [2, 0, 1])
    return fig


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    jpg = tmp_path / "photo.jpg"
    jpg.write_bytes(jpeg_bytes())
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    return {"jpg": jpg, "txt": text, "dir": tmp_path, "missing": tmp_path / "nope.png"}


def decoded(data: bytes) -> tuple[str, tuple[int, int]]:
    with Image.open(io.BytesIO(data)) as image:
        return image.format, image.size


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda f: pil(), ("PNG", (6, 4))),
        (lambda f: pil("RGBA"), ("PNG", (6, 4))),
        (lambda f: pil("L"), ("PNG", (6, 4))),
        (lambda f: pil("CMYK"), ("PNG", (6, 4))),  # PNG has no CMYK: converted
        (lambda f: pil("I;16"), ("PNG", (6, 4))),
        (lambda f: figure(), ("PNG", (100, 75))),  # figsize x dpi
        (lambda f: jpeg_bytes(), ("JPEG", (6, 4))),
        (lambda f: bytearray(jpeg_bytes()), ("JPEG", (6, 4))),
        (lambda f: memoryview(jpeg_bytes()), ("JPEG", (6, 4))),
        (lambda f: f["jpg"], ("JPEG", (6, 4))),
        (lambda f: str(f["jpg"]), ("JPEG", (6, 4))),
    ],
)
def test_each_kind_of_value_becomes_an_image_file(files, make, expected):
    assert decoded(image_bytes(make(files))) == expected


def test_the_current_figure_is_a_figure():
    plt.close("all")
    plt.figure(figsize=(1, 1), dpi=40)
    plt.plot([1, 2])
    assert decoded(image_bytes(plt.gcf())) == ("PNG", (40, 40))
    plt.close("all")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda f: 42, "the image is a int; give a PIL image, a matplotlib figure"),
        (lambda f: [jpeg_bytes()], "the image is a list; give"),
        (lambda f: None, "the image is a NoneType; give"),
        (lambda f: b"", "the image is empty bytes"),
        (lambda f: b"GIF8 nearly", "the image: the bytes are not an image file (PNG, JPEG"),
        (lambda f: f["missing"], "the image: no file '"),
        (lambda f: str(f["missing"]), "nope.png'"),
        (lambda f: f["dir"], "is not a file"),
        (lambda f: f["txt"], "notes.txt' is not an image file (PNG, JPEG, GIF or BMP)"),
        (lambda f: plt, "the image is a module; give"),  # pyplot itself: use plt.gcf()
    ],
)
def test_what_is_not_an_image_is_a_clear_error(files, make, message):
    with pytest.raises(ImageValueError) as e:
        image_bytes(make(files))
    assert message in str(e.value)


def test_base64_and_data_urls_carry_the_file():
    data = jpeg_bytes()
    assert base64.b64decode(image_base64(data)) == data
    url = image_url(data)
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == data
    assert image_url(pil()).startswith("data:image/png;base64,")
    assert images_base64(None) == []
    assert images_base64(data) == [image_base64(data)]
    assert len(images_base64([data, pil()])) == 2
    with pytest.raises(ImageValueError, match=r"images\[1\] is a int"):
        images_base64([data, 3])


def test_image_variables_come_from_the_namespace():
    ns = {"fig": figure(), "photo": jpeg_bytes(), "n": 3}
    found = images_from_namespace(["fig", "photo"], ns)
    assert [image_format(base64.b64decode(b)) for b in found] == ["png", "jpeg"]
    with pytest.raises(ImageValueError, match="--image: 'nothing' is not defined"):
        images_from_namespace(["fig", "nothing"], ns)
    with pytest.raises(ImageValueError, match="--image n is a int"):
        images_from_namespace(["n"], ns)


@pytest.mark.parametrize(
    ("line", "images"),
    [
        ("tiny", []),
        ("tiny --image fig", ["fig"]),
        ("tiny --image fig --image photo -n 3", ["fig", "photo"]),
    ],
)
def test_image_is_a_repeatable_option(line, images):
    assert parse_cell_args(line).images == images


def test_map_bodies_carry_the_call_or_the_items_images():
    photo = jpeg_bytes()
    items = to_items(["a", {"prompt": "b", "images": photo}])
    assert items[1].images == (image_base64(photo),)
    common = dict(system=None, options={}, fmt=None, keep_alive=None, images=["CALL"])
    _, chat = request_body("m", items[0], mode="chat", **common)
    assert chat["messages"] == [{"role": "user", "content": "a", "images": ["CALL"]}]
    _, own = request_body("m", items[1], mode="generate", **common)
    assert own["images"] == [image_base64(photo)]
    _, none = request_body("m", Item("c"), mode="chat", **{**common, "images": ()})
    assert "images" not in none["messages"][0]
    with pytest.raises(TypeError, match="item 0: images is a int"):
        to_items([{"prompt": "x", "images": 5}])
