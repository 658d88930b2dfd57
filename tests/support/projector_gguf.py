"""A projector-shaped GGUF (``general.architecture = "clip"``) for store,
show and estimate tests: real headers and tensor tables, read by the real
readers. It is not loadable by mtmd; the runner's tests use
``jupyter_llm.demo.write_vision_model`` for that."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_projector_header(
    path: Path,
    *,
    image_size: int = 32,
    patch_size: int = 8,
    n_embd: int = 16,
    n_ff: int = 32,
    n_head: int = 2,
    projector_type: str = "mlp",
    tensor_elements: int = 1024,
) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.type", "mmproj")
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_uint32("clip.vision.block_count", 1)
    writer.add_tensor("v.patch_embd.weight", np.zeros(tensor_elements, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
