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
from typing import Any

MAX_IMAGE_BYTES = 20 << 20  # one decoded image (the JSON body's cap is 32 MiB)
MAX_IMAGES = 32  # in one request, all messages together
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
_WHITESPACE = re.compile(r"\s+")


def image_format(data: bytes) -> str | None:
    """The format the bytes start like ("png", "jpeg", "gif", "bmp"), or None."""
    return next((name for name, magic in FORMATS if data.startswith(magic)), None)


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
    text = _WHITESPACE.sub("", value)
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
    return text


def parse_images(raw: Any, field: str = "images") -> list[str]:
    """Ollama's ``images``: a list of base64 strings (None or empty: none)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{field} must be a list of base64 strings")
    if len(raw) > MAX_IMAGES:
        raise ValueError(f"{field} has {len(raw)} images, at most {MAX_IMAGES}")
    return [parse_image(item, f"{field}[{i}]") for i, item in enumerate(raw)]


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


def check_image_count(count: int) -> None:
    if count > MAX_IMAGES:
        raise ValueError(f"the request has {count} images, at most {MAX_IMAGES}")
