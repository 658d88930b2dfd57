"""A tiny Mamba (recurrent) GGUF, f32 with random weights: a model whose
memory is a state per sequence, not a cache of cells."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from jupyter_llm import demo

WIDTH, INNER, STATE, RANK, KERNEL, LAYERS = 32, 64, 8, 4, 4, 2


def write_mamba(path: Path) -> Path:
    tokens, types, merges = demo.vocabulary(())
    rng = np.random.default_rng(1)

    def weights(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_name("tiny-mamba")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(2048)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_head_count_kv(0)
    writer.add_ssm_conv_kernel(KERNEL)
    writer.add_ssm_inner_size(INNER)
    writer.add_ssm_state_size(STATE)
    writer.add_ssm_time_step_rank(RANK)
    writer.add_layer_norm_rms_eps(1e-5)
    demo.write_tokenizer(writer, tokens, types, merges)
    writer.add_add_bos_token(False)
    writer.add_tensor("token_embd.weight", weights(len(tokens), WIDTH, scale=1.0))
    for i in range(LAYERS):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(WIDTH, np.float32))
        writer.add_tensor(f"{block}.ssm_in.weight", weights(2 * INNER, WIDTH))
        writer.add_tensor(f"{block}.ssm_conv1d.weight", weights(INNER, KERNEL))
        writer.add_tensor(f"{block}.ssm_conv1d.bias", weights(INNER))
        writer.add_tensor(f"{block}.ssm_x.weight", weights(RANK + 2 * STATE, INNER))
        writer.add_tensor(f"{block}.ssm_dt.weight", weights(INNER, RANK))
        writer.add_tensor(f"{block}.ssm_dt.bias", weights(INNER))
        writer.add_tensor(f"{block}.ssm_a", -np.exp(weights(INNER, STATE)))
        writer.add_tensor(f"{block}.ssm_d", np.ones(INNER, np.float32))
        writer.add_tensor(f"{block}.ssm_out.weight", weights(WIDTH, INNER))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    writer.add_tensor("output.weight", weights(len(tokens), WIDTH, scale=1.0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
