"""GGUF metadata the store and API report.

Headers come from uploads and pulls, so they are read with our own bounded
reader (``gguf_header``), never with the ``gguf`` package's GGUFReader (it
memory-maps the file and builds an object per item, so a 49-byte header that
claims a 2^63-item array exhausts the server's memory). A header this server
refuses is an ``InvalidRequest`` ("invalid model file: ..."), a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jupyter_llm.chat_formats.builtin import HINT_MARKERS, BuiltinTemplate, choose_builtin
from jupyter_llm.models.gguf_header import (
    MAGIC,
    GGUFFormatError,
    GGUFHeader,
    LongArray,
    TensorInfo,
    read_header,
)
from jupyter_llm.request.errors import InvalidRequest

GGUF_MAGIC = MAGIC
# llama.cpp models have at most a few hundred blocks; the estimate keeps a
# list per block, so the count is bounded before anything is sized by it.
MAX_BLOCK_COUNT = 4096
SHOW_ARRAY_LIMIT = 32  # longer arrays are null in a non-verbose /api/show
MAX_ARCHITECTURE = 64  # llama.cpp's names are short: "llama", "qwen3moe"

# llama.cpp's LLAMA_FTYPE values, as Ollama names them in "quantization_level".
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
}


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    name: str
    file_type: str
    parameter_count: int
    context_length: int
    embedding_length: int
    block_count: int
    chat_template: str
    kind: str = ""  # general.type: "model", "adapter", "mmproj"...

    @property
    def is_projector(self) -> bool:
        """A multimodal projector (an mmproj file) rather than a language model."""
        return self.kind in ("mmproj", "projector") or self.architecture == "clip"

    @property
    def parameter_size(self) -> str:
        """Ollama's human form: 7.2B, 135M, 60K."""
        n = self.parameter_count
        for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if n >= scale:
                return f"{n / scale:.1f}{unit}" if n < 10 * scale else f"{n / scale:.0f}{unit}"
        return str(n)


def load_header(path: Path, array_limit: int | None) -> GGUFHeader:
    """``read_header`` with a refused file as an ``InvalidRequest``. Blocking."""
    try:
        return read_header(path, array_limit)
    except GGUFFormatError as e:
        raise InvalidRequest(f"invalid model file: {e}") from None


def integer(
    metadata: dict[str, object], key: str, default: int, cap: int, per_layer: bool = False
) -> int:
    """An integer key in ``0..cap``; ``per_layer`` also takes an array (some
    models give a value per block) and answers its largest item."""
    value = metadata.get(key, default)
    if per_layer and isinstance(value, list | LongArray):
        if isinstance(value, LongArray) or len(value) > MAX_BLOCK_COUNT:
            raise InvalidRequest(f"invalid model file: {key} has {len(value)} values")
        if not all(isinstance(v, int) for v in value):
            raise InvalidRequest(f"invalid model file: {key} must hold integers")
        value = max(value) if value else default
    if not isinstance(value, int):
        raise InvalidRequest(f"invalid model file: {key} must be an integer")
    if not 0 <= value <= cap:
        raise InvalidRequest(f"invalid model file: {key} is {value}, outside 0..{cap}")
    return int(value)


def text(metadata: dict[str, object], key: str, default: str) -> str:
    value = metadata.get(key, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"invalid model file: {key} must be a string")
    return value


def architecture(metadata: dict[str, object], default: str) -> str:
    """``general.architecture``, which prefixes every other key we read."""
    arch = text(metadata, "general.architecture", default)
    if len(arch) > MAX_ARCHITECTURE:
        raise InvalidRequest("invalid model file: general.architecture is too long")
    return arch


def read_gguf_info(path: Path) -> GGUFInfo:
    """Parse the header and tensor table; blocking, call it in an executor."""
    header = load_header(path, array_limit=0)  # no array is needed here
    meta = header.metadata
    arch = architecture(meta, "unknown")
    file_type = (
        integer(meta, "general.file_type", 0, 1 << 31) if "general.file_type" in meta else -1
    )
    return GGUFInfo(
        architecture=arch,
        name=text(meta, "general.name", ""),
        file_type=FILE_TYPES.get(file_type, "unknown"),
        parameter_count=sum(t.n_elements for t in header.tensors),
        context_length=integer(meta, f"{arch}.context_length", 0, 1 << 63),
        embedding_length=integer(meta, f"{arch}.embedding_length", 0, 1 << 63),
        block_count=integer(meta, f"{arch}.block_count", 0, MAX_BLOCK_COUNT),
        chat_template=text(meta, "tokenizer.chat_template", ""),
        kind=text(meta, "general.type", ""),
    )


def read_metadata(path: Path, verbose: bool = False) -> dict[str, object]:
    """All GGUF key/values, as Ollama's ``model_info``: long arrays (the
    tokenizer's) are None unless ``verbose`` (then they are read, within the
    reader's memory cap). Blocking."""
    return read_model_info(path, verbose)[0]


def read_model_info(
    path: Path, verbose: bool = False
) -> tuple[dict[str, object], tuple[TensorInfo, ...]]:
    """``read_metadata`` and the tensor table, from one read of the header
    (``/api/show`` sends both). Blocking."""
    header = load_header(path, None if verbose else SHOW_ARRAY_LIMIT)
    info: dict[str, object] = {
        key: None if isinstance(value, LongArray) else value
        for key, value in header.metadata.items()
    }
    info["general.parameter_count"] = sum(t.n_elements for t in header.tensors)
    return info, header.tensors


TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 3, 4  # gguf's TokenType


def marker_tokens(path: Path, texts: tuple[str, ...]) -> frozenset[str]:
    """Which of ``texts`` are control or user-defined tokens of the GGUF's
    vocabulary, as the runner's ``Model._has_marker`` asks llama.cpp.
    Reads the whole vocabulary; one past the reader's memory cap counts as
    holding none (what needed only the markers still answers). Blocking."""
    try:
        meta = load_header(path, None).metadata
    except InvalidRequest:
        return frozenset()
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or not isinstance(types, list):
        return frozenset()
    wanted = set(texts)
    return frozenset(
        token
        for token, kind in zip(tokens, types, strict=False)
        if token in wanted and kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    )


def builtin_template(path: Path, metadata: dict[str, object]) -> BuiltinTemplate | None:
    """The built-in chat template the runner renders this model's chats with
    (``chat_formats.builtin``): None where the GGUF has its own, or where its
    family is unknown. The vocabulary is read only if the architecture leaves
    the family open. Blocking."""
    if metadata.get("tokenizer.chat_template"):
        return None
    markers: list[frozenset[str]] = []

    def has_token(text: str) -> bool:
        if not markers:
            markers.append(marker_tokens(path, HINT_MARKERS))
        return text in markers[0]

    arch, pre = metadata.get("general.architecture"), metadata.get("tokenizer.ggml.pre")
    return choose_builtin(
        arch if isinstance(arch, str) else "", has_token, pre if isinstance(pre, str) else ""
    )
