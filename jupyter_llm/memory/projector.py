"""A vision projector's memory: its weights and the compute buffer clip reserves.

llama.cpp's mtmd loads the projector (an mmproj GGUF) into one backend: the
first GPU when the runner offloads layers, else the CPU. At load it reserves
the compute graph of one warm-up image (``clip.cpp``: ``warmup`` builds the
encoder's graph for a ``warmup_image_size`` square image and
``reserve_compute_meta`` sizes the buffer for it). The warm-up image is the
projector's ``image_size``, except for the projector types that cap it at a
number of output tokens to avoid running out of memory (``WARMUP_TOKENS``).

The graph estimate is the peak of one encoder block over ``n_pos`` patches:
the input image in f32, the residual stream and its normalised copy, Q, K and
V, the feed-forward activation, and the attention scores of every head
(``n_head * n_pos^2``, the term that dominates; clip reserves without flash
attention when the backend lacks it). The header is read with the bounded
reader; counts are capped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jupyter_llm.models.gguf_info import architecture, integer, load_header, text

MAX_IMAGE_SIZE = 1 << 14
MAX_PATCH_SIZE = 1 << 10
MAX_EMBEDDING = 1 << 16
MAX_HEADS = 1 << 10
MAX_FF = 1 << 18
MAX_BLOCKS = 1 << 10
MAX_MERGE = 1 << 4

# Projector types whose warm-up image is cut to this many tokens (per
# ``clip.cpp``'s ``set_warmup_n_tokens``), and the merge their patches use
# when the header does not say (``clip.vision.spatial_merge_size``).
WARMUP_TOKENS: dict[str, tuple[int, int]] = {
    "phi4": (16 * 16, 1),
    "pixtral": (256, 2),
    "lightonocr": (256, 2),
    "kimivl": (256, 2),
    "gemma4v": (256, 1),
    "gemma4uv": (256, 1),
    "qwen2vl_merger": (46 * 46, 2),
    "qwen2.5vl_merger": (46 * 46, 2),
    "qwen3vl_merger": (46 * 46, 2),
    "ling3vl": (46 * 46, 2),
    "dots_ocr": (46 * 46, 2),
    "mimovl": (46 * 46, 2),
    "glm4v": (46 * 46, 2),
    "glm5v": (46 * 46, 2),
    "youtuvl": (16 * 16, 2),
    "paddleocr": (28 * 28, 2),
    "hunyuanvl": (32 * 32, 2),
}
F32 = 4


@dataclass(frozen=True)
class ProjectorInfo:
    """What the estimate needs of a projector GGUF."""

    projector_type: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_head: int
    n_layer: int
    spatial_merge: int  # 0: not in the header
    weights_bytes: int  # all its tensors

    @property
    def warmup_positions(self) -> int:
        """Patches in the image clip warms up with."""
        if self.projector_type in WARMUP_TOKENS:
            tokens, merge = WARMUP_TOKENS[self.projector_type]
            merge = self.spatial_merge or merge
            return tokens * merge * merge
        side = self.image_size // self.patch_size if self.patch_size else 0
        return side * side + 1  # and the class token, where there is one


def projector_graph(info: ProjectorInfo) -> int:
    """Bytes of the compute buffer clip reserves for the warm-up image."""
    n_pos = info.warmup_positions
    if n_pos <= 1 or not info.n_embd:
        return 0
    side = info.image_size or int(n_pos**0.5) * max(info.patch_size, 1)
    image = 3 * side * side
    activations = n_pos * (6 * info.n_embd + info.n_ff)
    scores = info.n_head * n_pos * n_pos
    return F32 * (image + activations + scores)


def read_projector_info(path: Path) -> ProjectorInfo:
    """Blocking (parses the GGUF header and tensor table): call from an executor."""
    header = load_header(path, array_limit=0)
    meta = header.metadata
    architecture(meta, "clip")  # checked like a model's

    def value(key: str, cap: int) -> int:
        return integer(meta, f"clip.vision.{key}", 0, cap, per_layer=True)

    kind = text(meta, "clip.vision.projector_type", "") or text(meta, "clip.projector_type", "")
    return ProjectorInfo(
        projector_type=kind[:64],
        image_size=value("image_size", MAX_IMAGE_SIZE),
        patch_size=value("patch_size", MAX_PATCH_SIZE),
        n_embd=value("embedding_length", MAX_EMBEDDING),
        n_ff=value("feed_forward_length", MAX_FF),
        n_head=value("attention.head_count", MAX_HEADS),
        n_layer=value("block_count", MAX_BLOCKS),
        spatial_merge=value("spatial_merge_size", MAX_MERGE),
        weights_bytes=sum(t.n_bytes for t in header.tensors),
    )
