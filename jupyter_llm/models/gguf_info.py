"""GGUF metadata the store and API report (read with the ``gguf`` package)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jupyter_llm.errors import InvalidRequest

GGUF_MAGIC = b"GGUF"

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

    @property
    def parameter_size(self) -> str:
        """Ollama's human form: 7.2B, 135M, 60K."""
        n = self.parameter_count
        for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if n >= scale:
                return f"{n / scale:.1f}{unit}" if n < 10 * scale else f"{n / scale:.0f}{unit}"
        return str(n)


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def read_gguf_info(path: Path) -> GGUFInfo:
    """Parse the header and tensor table; blocking, call it in an executor."""
    import gguf

    if not is_gguf(path):
        raise InvalidRequest("invalid model file: not a GGUF file")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the gguf package raises assorted errors on corrupt files
        raise InvalidRequest(f"invalid model file: {e}") from e

    def value(key: str, default: object = None) -> object:
        field = reader.get_field(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception:
            return default

    arch = str(value("general.architecture", "unknown"))
    return GGUFInfo(
        architecture=arch,
        name=str(value("general.name", "")),
        file_type=FILE_TYPES.get(int(value("general.file_type", -1)), "unknown"),
        parameter_count=sum(int(t.n_elements) for t in reader.tensors),
        context_length=int(value(f"{arch}.context_length", 0)),
        embedding_length=int(value(f"{arch}.embedding_length", 0)),
        block_count=int(value(f"{arch}.block_count", 0)),
        chat_template=str(value("tokenizer.chat_template", "")),
    )


def read_metadata(path: Path, verbose: bool = False) -> dict[str, object]:
    """All GGUF key/values, as Ollama's ``model_info``: long arrays (the
    tokenizer's) are None unless ``verbose``. Blocking."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    info: dict[str, object] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            value = field.contents()
        except Exception:
            continue
        if isinstance(value, list) and len(value) > 32 and not verbose:
            value = None
        info[key] = value
    info["general.parameter_count"] = sum(int(t.n_elements) for t in reader.tensors)
    return info
