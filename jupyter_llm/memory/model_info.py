"""What the estimate needs to know about a model, read from its GGUF.

The header is read with the bounded reader the store uses (not the ``gguf``
package's GGUFReader), and every count the estimate sizes a list or a sum by
(blocks, heads, embedding, vocabulary) is capped, so a hostile header is an
``InvalidRequest`` ("invalid model file: ...") rather than an exhausted server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jupyter_llm.models.gguf_header import array_length
from jupyter_llm.models.gguf_info import MAX_BLOCK_COUNT, architecture, integer, load_header

_BLOCK = re.compile(r"^blk\.(\d+)\.")

# Far above real models (embedding 16k, 128 heads, head size 576, 262k tokens).
MAX_EMBEDDING = 1 << 20
MAX_HEADS = 1 << 14
MAX_HEAD_DIM = 1 << 16
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 32
FLOAT_TYPES = (0, 1, 30)  # ggml's F32, F16 and BF16


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
    n_ff: int = 0  # feed-forward width (the largest block's); 0: 4 x n_embd
    tied_embeddings: bool = False  # no output tensor: token_embd is also the output layer
    n_swa: int = 0  # sliding window (0: none)
    swa_pattern: int | None = None  # from the GGUF's sliding_window_pattern, if present
    # a matrix (2 dimensions or more) in f32, f16 or bf16: llama.cpp multiplies
    # it by several rows with other kernels than by one (memory.kv_cache)
    float_matrices: bool = False

    @property
    def weights_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes


def read_model_info(path: Path) -> ModelInfo:
    """Blocking (parses the GGUF header and tensor table): call from an executor."""
    # per-block arrays are kept (at most MAX_BLOCK_COUNT items), the tokenizer's skipped
    header = load_header(path, array_limit=MAX_BLOCK_COUNT)
    meta = header.metadata

    def value(key: str, default: int, cap: int) -> int:
        return integer(meta, key, default, cap, per_layer=True)

    arch = architecture(meta, "llama")
    n_layer = value(f"{arch}.block_count", 0, MAX_BLOCK_COUNT)
    n_embd = value(f"{arch}.embedding_length", 0, MAX_EMBEDDING)
    n_head = value(f"{arch}.attention.head_count", 1, MAX_HEADS) or 1
    n_head_kv = value(f"{arch}.attention.head_count_kv", n_head, MAX_HEADS) or n_head
    head_dim = n_embd // n_head
    n_tokens = array_length(meta.get("tokenizer.ggml.tokens")) or 0
    n_vocab = value(f"{arch}.vocab_size", n_tokens, MAX_VOCAB)

    layers = [0] * n_layer
    output = output_norm = token_embd = 0
    float_matrices = False
    for t in header.tensors:
        size = t.n_bytes
        float_matrices |= t.ggml_type in FLOAT_TYPES and len(t.dims) > 1 and t.dims[1] > 1
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
        head_dim_k=value(f"{arch}.attention.key_length", head_dim, MAX_HEAD_DIM),
        head_dim_v=value(f"{arch}.attention.value_length", head_dim, MAX_HEAD_DIM),
        n_vocab=n_vocab,
        context_length=value(f"{arch}.context_length", 0, MAX_CONTEXT),
        layer_bytes=tuple(layers),
        output_bytes=(output or token_embd) + output_norm,
        input_bytes=token_embd,
        embedding_only=bool(value(f"{arch}.pooling_type", 0, 1 << 31)) and not output,
        n_ff=value(f"{arch}.feed_forward_length", 0, MAX_EMBEDDING),
        tied_embeddings=not output and bool(token_embd),
        float_matrices=float_matrices,
        n_swa=value(f"{arch}.attention.sliding_window", 0, MAX_CONTEXT),
        swa_pattern=_pattern(meta.get(f"{arch}.attention.sliding_window_pattern")),
    )


def _pattern(raw: object) -> int | None:
    return (
        raw if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 1 << 16 else None
    )
