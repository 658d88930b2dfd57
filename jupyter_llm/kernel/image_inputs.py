"""Notebook values as images for the API: ``%%llm --image VAR``,
``jupyter_llm.map(images=...)`` and the helpers for the official clients
(``jupyter_llm.image_base64``, ``jupyter_llm.image_url``).

An image is a PIL image or a matplotlib figure (both rendered to PNG),
the bytes of an image file, or the path of one (``str`` or
``pathlib.Path``). The server takes the file's bytes as base64 (Ollama's
``images``) or in a ``data:`` URL (OpenAI's ``image_url`` part); the
format is checked here by its magic bytes with the server's own table
(``jupyter_llm.request.images``), so a wrong value fails in the cell, clearly,
before anything is sent. Neither PIL nor matplotlib is imported here: a
value is recognised by its type's module and methods.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jupyter_llm.request.images import FORMAT_NAMES, MAX_IMAGE_BYTES, image_format

KINDS = "a PIL image, a matplotlib figure, an image file's bytes, or its path (str or Path)"
MIME = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "bmp": "image/bmp"}


class ImageValueError(ValueError):
    """A value that is not an image this server reads; the message says why."""


def _module(value: Any) -> str:
    return type(value).__module__ or ""


def is_pil_image(value: Any) -> bool:
    return _module(value).startswith("PIL.") and callable(getattr(value, "save", None))


def is_figure(value: Any) -> bool:
    """A matplotlib ``Figure`` (``plt.gcf()``, ``fig, ax = plt.subplots()``)."""
    return _module(value).startswith("matplotlib.") and callable(getattr(value, "savefig", None))


def image_bytes(value: Any, what: str = "the image") -> bytes:
    """The bytes of an image file for ``value`` (see the module's note)."""
    if is_pil_image(value):
        buffer = io.BytesIO()
        image = (
            value if value.mode in ("RGB", "RGBA", "L", "LA", "P", "1") else value.convert("RGB")
        )
        image.save(buffer, format="PNG")
        data = buffer.getvalue()
    elif is_figure(value):
        buffer = io.BytesIO()
        value.savefig(buffer, format="png")
        data = buffer.getvalue()
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if not data:
            raise ImageValueError(f"{what} is empty bytes")
        if image_format(data) is None:
            raise ImageValueError(f"{what}: the bytes are not an image file ({FORMAT_NAMES})")
    elif isinstance(value, str | os.PathLike):
        data = _read_file(Path(value), what)
    else:
        raise ImageValueError(f"{what} is a {type(value).__name__}; give {KINDS}")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageValueError(f"{what} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    return data


def _read_file(path: Path, what: str) -> bytes:
    if not path.exists():
        raise ImageValueError(f"{what}: no file {str(path)!r}")
    if not path.is_file():
        raise ImageValueError(f"{what}: {str(path)!r} is not a file")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise ImageValueError(f"{what}: {str(path)!r} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImageValueError(f"{what}: cannot read {str(path)!r}: {e.strerror or e}") from None
    if image_format(data) is None:
        raise ImageValueError(f"{what}: {str(path)!r} is not an image file ({FORMAT_NAMES})")
    return data


def image_base64(value: Any, what: str = "the image") -> str:
    """``value`` as Ollama's ``images`` take it: base64 of the file's bytes."""
    return base64.b64encode(image_bytes(value, what)).decode("ascii")


def image_url(value: Any, what: str = "the image") -> str:
    """``value`` as a ``data:`` URL, for OpenAI's ``image_url`` content part."""
    data = image_bytes(value, what)
    mime = MIME[image_format(data) or "png"]
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def images_base64(values: Any, what: str = "images") -> list[str]:
    """One image or a list of them (``images=`` of the notebook API) as base64."""
    if values is None:
        return []
    if isinstance(values, list | tuple):
        return [image_base64(v, f"{what}[{i}]") for i, v in enumerate(values)]
    return [image_base64(values, what)]


def namespace_values(names: Iterable[str], namespace: dict[str, Any]) -> list[Any]:
    """``--image VAR`` (repeatable): the variables' values, each defined."""
    for name in names:
        if name not in namespace:
            raise ImageValueError(f"--image: {name!r} is not defined")
    return [namespace[name] for name in names]


def image_files(names: Iterable[str], namespace: dict[str, Any]) -> list[bytes]:
    """``--image VAR`` (repeatable): each variable's image file's bytes."""
    names = list(names)
    values = namespace_values(names, namespace)
    return [image_bytes(v, f"--image {n}") for n, v in zip(names, values, strict=True)]


def images_from_namespace(names: Iterable[str], namespace: dict[str, Any]) -> list[str]:
    """``--image VAR`` (repeatable): each variable's image as base64."""
    return [base64.b64encode(data).decode("ascii") for data in image_files(names, namespace)]
