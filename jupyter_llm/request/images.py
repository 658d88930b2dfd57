"""Images in requests: the one validator both APIs use.

Ollama sends an image as base64 of the file's bytes (``images`` on
``/api/generate``, ``message.images`` on ``/api/chat``); OpenAI as an
``image_url`` content part holding a ``data:`` URL. Either way the runner
receives base64 of a file that llama.cpp's image decoder (stb_image, inside
mtmd) can read, so the format is checked here by its magic bytes, before
anything loads. This server never fetches an image URL. Errors are plain
``ValueError``s naming the field; ``api/requests.py`` turns them into 400s.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any

from jupyter_llm.request.limits import IMAGE_BYTES, IMAGE_PIXELS, IMAGE_SIDE, IMAGES, REQUEST_PIXELS

MAX_IMAGE_BYTES = IMAGE_BYTES.value  # one decoded image (the JSON body's cap is 32 MiB)
MAX_IMAGES = IMAGES.value  # in one request, all messages together
# The formats stb_image decodes that clients send, by their first bytes.
FORMATS = (
    ("png", b"\x89PNG\r\n\x1a\n"),
    ("jpeg", b"\xff\xd8\xff"),
    ("gif", b"GIF87a"),
    ("gif", b"GIF89a"),
    ("bmp", b"BM"),
)
FORMAT_NAMES = "PNG, JPEG, GIF or BMP"
_DATA_URL = re.compile(
    r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?),(?P<data>.*)$", re.S
)


def image_format(data: bytes) -> str | None:
    """The format the bytes start like ("png", "jpeg", "gif", "bmp"), or None."""
    return next((name for name, magic in FORMATS if data.startswith(magic)), None)


class ImageText(str):
    """Base64 of a checked image file, knowing its pixels (for the request's total)."""

    pixels: int = 0


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height as the file's header declares them (PNG's IHDR, JPEG's
    SOF, GIF's logical screen, BMP's info header), read before anything is
    decoded: the decoder allocates what the header says. None if unreadable."""
    try:
        if data.startswith(b"\x89PNG") and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if data.startswith(b"GIF"):
            return struct.unpack("<HH", data[6:10])
        if data.startswith(b"BM"):
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)
        if data.startswith(b"\xff\xd8"):
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


# JPEG markers that start a frame (SOF0-3, 5-7, 9-11, 13-15) and carry its size
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


# segments (and fill bytes) walked before the frame: a camera's JPEG has a few
# dozen (EXIF, ICC profile pieces, tables); millions of empty ones took seconds
JPEG_SEGMENTS = 4096


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The size in the first SOF segment, walking the segments from SOI (at
    most ``JPEG_SEGMENTS`` of them)."""
    i = 2
    for _ in range(JPEG_SEGMENTS):
        if i + 4 > len(data):
            return None
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame first
            return None
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def check_pixels(data: bytes, field: str) -> int:
    """The image's pixels, within ``IMAGE_SIDE`` and ``IMAGE_PIXELS``."""
    size = image_size(data)
    if size is None:
        raise ValueError(f"{field}: the image's header does not say its size")
    width, height = size
    if not width or not height:
        raise ValueError(f"{field}: the image has no pixels ({width}x{height})")
    where = f"{field} ({width}x{height})"
    IMAGE_SIDE.check(where, max(width, height))
    IMAGE_PIXELS.check(where, width * height)
    return width * height


def parse_image(value: Any, field: str) -> str:
    """One base64 image as the runner takes it (the file's bytes, standard
    base64 without whitespace); a ``ValueError`` names what is wrong."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a base64 string of the image file")
    if value.startswith("data:"):
        raise ValueError(
            f"{field} must be plain base64 of the image file, not a data: URL "
            "(drop the data:...;base64, prefix)"
        )
    text = "".join(value.split())  # whitespace out (a regex took 0.3 s on 27 MB)
    if not text:
        raise ValueError(f"{field} is empty")
    if len(text) > (MAX_IMAGE_BYTES // 3 + 1) * 4:
        raise ValueError(f"{field} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field} is not valid base64") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{field} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    if image_format(data) is None:
        raise ValueError(f"{field} is not an image this server reads ({FORMAT_NAMES})")
    image = ImageText(text)
    image.pixels = check_pixels(data, field)
    return image


def parse_images(raw: Any, field: str = "images") -> list[str]:
    """Ollama's ``images``: a list of base64 strings (None or empty: none)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{field} must be a list of base64 strings")
    IMAGES.check(field, len(raw))
    images = [parse_image(item, f"{field}[{i}]") for i, item in enumerate(raw)]
    check_request_images(images)
    return images


def parse_image_url(part: dict[str, Any], field: str) -> str:
    """An OpenAI ``image_url`` part (``{"url": ...}`` or the URL as a string)
    whose URL is a ``data:image/...;base64,`` URL, as base64."""
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
        field = f"{field}.image_url.url"
    else:
        field = f"{field}.image_url"
    if not isinstance(url, str) or not url:
        raise ValueError(f"{field} must be a data: URL string")
    if re.match(r"^[a-z][a-z0-9+.-]*://", url, re.I):
        raise ValueError(
            f"{field}: this server does not fetch image URLs; send the image itself "
            "as a data: URL (data:image/png;base64,...)"
        )
    m = _DATA_URL.match(url)
    if not m:
        raise ValueError(f"{field} must be a data: URL (data:image/png;base64,...)")
    if m.group("type") and not m.group("type").lower().startswith("image/"):
        raise ValueError(f"{field} is a data: URL of {m.group('type')}, not of an image")
    if ";base64" not in m.group("params").lower():
        raise ValueError(f"{field} must be a base64 data: URL (data:image/png;base64,...)")
    return parse_image(m.group("data"), field)


def check_request_images(images: list[str], held: tuple[int, int] = (0, 0)) -> None:
    """A request's images together: their count and pixels, with ``held``
    (the count and pixels of images its model brings)."""
    IMAGES.check("the request", held[0] + len(images))
    pixels = sum(getattr(image, "pixels", 0) for image in images)
    REQUEST_PIXELS.check("the request", held[1] + pixels)


MODELS_MEASURED = 64  # models whose MESSAGE images' pixels are kept (the cache starts over)
_model_pixels: dict[str, int] = {}  # manifest digest -> pixels


def check_with_model_images(
    digest: str, model_images: list[str], request_images: list[str]
) -> None:
    """A request's images with those its model's MESSAGE history brings
    (the model of manifest ``digest``), as the runner gets them: within the
    same bounds together (each side alone was, so a model of 32 images took
    32 more from the request). The store keeps the model's as text only:
    they are measured once per manifest, not at every request (32 images of
    20 MiB are 640 MiB of base64 to decode)."""
    if (pixels := _model_pixels.get(digest)) is None:
        field = "the model's MESSAGE images"
        pixels = sum(parse_image(value, field).pixels for value in model_images)
        if len(_model_pixels) >= MODELS_MEASURED:
            _model_pixels.clear()
        _model_pixels[digest] = pixels
    check_request_images(request_images, (len(model_images), pixels))
