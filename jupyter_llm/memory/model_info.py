"""What the estimate needs to know about a model, read from its GGUF."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    context_length: int
    layer_bytes: tuple[int, ...]  # weights of each block, blk.0 first
    output_bytes: int  # output (or tied token_embd) + output_norm: the last "layer"
    input_bytes: int  # token_embd: llama.cpp keeps the input layer on the CPU
    embedding_only: bool = False

    @property
    def weights_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes


def read_model_info(path: Path) -> ModelInfo:
    """Blocking (parses the GGUF header and tensor table): call from an executor."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def value(key: str, default: object) -> object:
        field = reader.get_field(key)
        if field is None:
            return default
        v = field.contents()
        if isinstance(v, list):  # per-layer arrays (some models): the largest value
            return max(v) if v else default
        return v

    arch = str(value("general.architecture", "llama"))
    n_layer = int(value(f"{arch}.block_count", 0))
    n_embd = int(value(f"{arch}.embedding_length", 0))
    n_head = int(value(f"{arch}.attention.head_count", 1)) or 1
    n_head_kv = int(value(f"{arch}.attention.head_count_kv", n_head)) or n_head
    head_dim = n_embd // n_head if n_head else 0
    tokens = reader.get_field("tokenizer.ggml.tokens")
    n_vocab = int(value(f"{arch}.vocab_size", len(tokens.data) if tokens else 0))

    layers = [0] * n_layer
    output = output_norm = token_embd = 0
    for t in reader.tensors:
        size = int(t.n_bytes)
        if m := _BLOCK.match(t.name):
            i = int(m.group(1))
            if i < n_layer:
                layers[i] += size
        elif t.name.startswith("output_norm"):
            output_norm += size
        elif t.name.startswith("output."):
            output += size
        elif t.name.startswith("token_embd"):
            token_embd += size
    return ModelInfo(
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=int(value(f"{arch}.attention.key_length", head_dim)),
        head_dim_v=int(value(f"{arch}.attention.value_length", head_dim)),
        n_vocab=n_vocab,
        context_length=int(value(f"{arch}.context_length", 0)),
        layer_bytes=tuple(layers),
        output_bytes=(output or token_embd) + output_norm,
        input_bytes=token_embd,
        embedding_only=bool(value(f"{arch}.pooling_type", 0)) and not output,
    )
