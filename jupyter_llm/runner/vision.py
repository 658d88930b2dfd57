"""Images in prompts, through llama.cpp's multimodal library (mtmd) and the
model's projector.

A prompt with images is tokenized by mtmd from parts (text, image, text...):
its text parts become tokens, each image a chunk of ``n`` positions whose
embeddings the projector computes. In a job's token list an image's
positions hold *marks*: negative numbers derived from the image's id (the
sha256 of its bytes) and the position, which no token can equal. So the
engine's prefix caches compare images as they compare tokens: a slot's cache
is reused across an image only if it holds the same image there.

Images are placed by markers: for a chat, each message's images go before
its text as markers unique to the request (so no user text can place or
move one) and the rendered template is split at them; a plain prompt may
place its images with mtmd's own marker (``<__media__>``), else they go at
its start. Runs in the runner process only.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import hashlib
import re
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
from llama_cpp import mtmd_cpp as mtmd

from jupyter_llm.runner.context_window import Span
from jupyter_llm.runner.protocol import EngineError, InputError

Part = str | bytes  # text of the prompt, or an image file's bytes
MARK_RANGE = 1 << 62


def image_marks(image_id: bytes, n: int) -> list[int]:
    """The ``n`` values standing for an image's positions: negative (never a
    token id), the same for the same image, different for another one."""
    marks = []
    for i in range(n):
        digest = hashlib.blake2b(image_id + i.to_bytes(4, "little"), digest_size=8).digest()
        marks.append(-1 - int.from_bytes(digest, "little") % MARK_RANGE)
    return marks


class ImageBytes(bytes):
    """An image file's bytes, with the request field they came from."""

    label = "an image"


def decode_images(values: Any, where: str = "images") -> list[bytes]:
    """A request's ``images`` (base64 text of image files, as Ollama sends
    them) as bytes; ``InputError`` naming the bad one."""
    if values is None:
        return []
    if not isinstance(values, list):
        raise InputError(f"{where} must be a list of base64 strings")
    out = []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InputError(f"{where}[{i}] must be a base64 string")
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{where}[{i}] is not valid base64") from None
        if not data:
            raise InputError(f"{where}[{i}] is empty")
        image = ImageBytes(data)
        image.label = f"{where}[{i}]"
        out.append(image)
    return out


def chat_markers() -> Callable[[int], str]:
    """Image ``k``'s marker for one chat: unguessable, so only the runner
    places images."""
    nonce = secrets.token_hex(8)
    return lambda k: f"<__image_{nonce}_{k}__>"


def split_chat(prompt: str, marker: Callable[[int], str], images: list[bytes]) -> list[Part]:
    """A rendered chat as parts: the text between the markers and the image
    each one names. An image whose message the history dropped is not used;
    a template that repeats a message repeats its image."""
    pattern = re.escape(marker(0)).replace("_0__", r"_(\d+)__")
    parts: list[Part] = []
    at = 0
    for match in re.finditer(pattern, prompt):
        k = int(match.group(1))
        if k >= len(images):
            continue
        parts += [prompt[at : match.start()], images[k]]
        at = match.end()
    parts.append(prompt[at:])
    return [p for p in parts if p != ""]


def split_plain(prompt: str, marker: str, images: list[bytes]) -> list[Part]:
    """A plain prompt as parts: images where it has ``marker``, else first."""
    pieces = prompt.split(marker)
    if len(pieces) == 1:
        parts: list[Part] = [*images, prompt]
    elif len(pieces) - 1 != len(images):
        raise InputError(
            f"the prompt has {len(pieces) - 1} image markers ({marker}) "
            f"but {len(images)} images were given"
        )
    else:
        parts = [pieces[0]]
        for image, text in zip(images, pieces[1:], strict=True):
            parts += [image, text]
    return [p for p in parts if p != ""]


def label(data: bytes) -> str:
    return getattr(data, "label", ImageBytes.label)


@dataclass
class ImageChunk:
    """One image of a prompt: its mtmd chunk and how many positions it takes."""

    pointer: Any  # mtmd_input_chunk *, owned by its ImagePrompt
    n_tokens: int
    id: str  # sha256 of the image file, hex

    def span(self, start: int) -> Span:
        return start, start + self.n_tokens


@dataclass
class ImagePrompt:
    """A prompt's tokens (marks at image positions) and its images by start."""

    tokens: list[int]
    images: dict[int, ImageChunk] = field(default_factory=dict)
    _owner: Any = None  # mtmd_input_chunks *
    _free: Callable[[Any], None] = lambda pointer: None

    def spans(self) -> list[Span]:
        return sorted(image.span(start) for start, image in self.images.items())

    def cut(self, head: int, tail: int) -> ImagePrompt:
        """The prompt without positions ``[head, tail)`` (no image across)."""
        if head >= tail:
            return self
        images = {s: im for s, im in self.images.items() if s < head}
        images |= {s - (tail - head): im for s, im in self.images.items() if s >= tail}
        kept = ImagePrompt(self.tokens[:head] + self.tokens[tail:], images, self._owner, self._free)
        self._owner = None  # the chunks now belong to the cut prompt
        return kept

    def close(self) -> None:
        if self._owner is not None:
            self._free(self._owner)
            self._owner = None


_LOG_WARN, _LOG_CONT = 3, 5  # enum ggml_log_level
_log = {"keep": True, "loading": True, "last_error": ""}


@llama_cpp.llama_log_callback
def _mtmd_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """mtmd's messages: all of them while the projector loads, then only
    warnings and errors (it reports every image it encodes)."""
    keep = _log["keep"] if level == _LOG_CONT else (_log["loading"] or level >= _LOG_WARN)
    _log["keep"] = keep
    line = text.decode(errors="replace")
    if level > _LOG_WARN and level != _LOG_CONT and line.strip():
        _log["last_error"] = line.strip()
    if keep:
        sys.stderr.write(line)
        sys.stderr.flush()


class Vision:
    """The mtmd context of one loaded model: its projector, image tokenizing,
    encoding and decoding into a llama context."""

    def __init__(self, projector: str, model: Any, n_threads: int, use_gpu: bool) -> None:
        mtmd.mtmd_helper_log_set(_mtmd_log, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = max(1, n_threads)
        params.print_timings = False
        _log["loading"], _log["last_error"] = True, ""
        try:
            self.ctx = mtmd.mtmd_init_from_file(projector.encode(), model, params)
        finally:
            _log["loading"] = False
        if not self.ctx:
            why = _log["last_error"].removeprefix("mtmd_init_from_file: error: ")
            raise EngineError(
                f"failed to load the projector {projector}" + (f": {why}" if why else "")
            )
        self.marker = (mtmd.mtmd_default_marker() or b"<__media__>").decode()
        self.refusal = ""  # why this runner cannot take images, though the projector loaded
        if not mtmd.mtmd_support_vision(self.ctx):
            self.refusal = "its projector has no image encoder"
        elif mtmd.mtmd_decode_use_mrope(self.ctx):
            self.refusal = "its projector places images with M-RoPE positions, not supported yet"

    def close(self) -> None:
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None

    def tokenize(self, parts: list[Part], add_special: bool, n_batch: int) -> ImagePrompt:
        """``parts`` as tokens and image chunks. ``InputError`` for an image
        that does not decode, or one that cannot be decoded in one batch
        where the model attends to it non-causally."""
        if self.refusal:
            raise InputError(f"this model cannot take images: {self.refusal}")
        texts, bitmaps, ids = [], [], []
        part_ptrs = []
        try:
            for part in parts:
                if isinstance(part, bytes):
                    bitmap = self._bitmap(part)
                    bitmaps.append(bitmap)
                    ids.append(hashlib.sha256(part).hexdigest())
                    mtmd.mtmd_bitmap_set_id(bitmap, ids[-1].encode())
                    part_ptrs.append(mtmd.mtmd_input_part(None, bitmap))
                else:
                    data = part.encode()
                    text = mtmd.mtmd_input_text(data, len(data), False, True)
                    texts.append((data, text))
                    part_ptrs.append(mtmd.mtmd_input_part(ctypes.pointer(text), None))
            array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(part_ptrs))(
                *[ctypes.pointer(p) for p in part_ptrs]
            )
            chunks = mtmd.mtmd_input_chunks_init()
            rc = mtmd.mtmd_tokenize_from_parts(self.ctx, chunks, array, len(part_ptrs), add_special)
            if rc != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                raise InputError(f"the images could not be tokenized (mtmd status {rc})")
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
        prompt = ImagePrompt([], {}, chunks, mtmd.mtmd_input_chunks_free)
        try:
            self._read_chunks(chunks, prompt, n_batch)
        except Exception:
            prompt.close()
            raise
        return prompt

    def _bitmap(self, data: bytes) -> Any:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
        if not bitmap:
            raise InputError(
                f"{label(data)} could not be decoded "
                "(the bytes of a PNG, JPEG, GIF or BMP file expected)"
            )
        if mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            raise InputError(f"{label(data)} is audio, not an image")
        return bitmap

    def _read_chunks(self, chunks: Any, prompt: ImagePrompt, n_batch: int) -> None:
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t(0)
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                prompt.tokens.extend(tokens[: count.value])
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise InputError("only images are supported as media")
            if mtmd.mtmd_decode_use_non_causal(self.ctx, chunk) and n > n_batch:
                raise InputError(
                    f"an image takes {n} positions, more than the batch ({n_batch}); "
                    "raise num_batch"
                )
            image_id = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()
            prompt.images[len(prompt.tokens)] = ImageChunk(chunk, n, image_id)
            prompt.tokens.extend(image_marks(image_id.encode(), n))

    def decode(self, lctx: Any, image: ImageChunk, pos: int, seq_id: int, n_batch: int) -> int:
        """Encode ``image`` and decode its embeddings into sequence ``seq_id``
        from position ``pos`` (on their own: embeddings cannot share a
        decode with tokens; non-causally where the model says). Returns the
        nanoseconds it took; ``EngineError`` if it failed."""
        t0 = time.perf_counter_ns()
        new_pos = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunk_single(
            self.ctx, lctx, image.pointer, pos, seq_id, n_batch, False, ctypes.byref(new_pos)
        )
        if rc != 0:
            raise EngineError(f"encoding or decoding an image failed (status {rc})")
        return time.perf_counter_ns() - t0
