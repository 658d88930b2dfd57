"""Which KV cache type a load actually gets (the ``kv_cache_type`` setting).

A quantized V cache needs flash attention in llama.cpp, so, as Ollama does,
``q8_0``/``q4_0`` fall back to ``f16`` (with a reason for the log and
``/api/ps``) where flash attention is off or the model cannot use it. Decided
on the server, before the load, so the memory estimate, the placement and the
runner all use the same type.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_llm.memory.model_info import ModelInfo

QUANTIZED = ("q8_0", "q4_0")
BLOCK = 32  # values per q8_0/q4_0 block: llama.cpp needs it to divide each head's width
# architectures Ollama keeps on an f16 cache whatever the setting (fs/ggml
# SupportsKVCacheType): gpt-oss's attention sinks
NO_QUANTIZED_CACHE = ("gptoss", "gpt-oss")


@dataclass(frozen=True)
class CacheChoice:
    """The type used and, when it is not the one asked for, why."""

    kv_type: str
    fallback: str = ""  # "" when the setting was followed


def choose_kv_type(requested: str, flash_attn: str, info: ModelInfo) -> CacheChoice:
    """``requested`` where this load can have it; otherwise f16 and the reason."""
    if requested not in QUANTIZED:
        return CacheChoice("f16")
    if flash_attn == "off":
        return CacheChoice("f16", f"{requested} needs flash attention, which is off")
    if info.embedding_only:
        return CacheChoice("f16", "an embedding model keeps no cache between requests")
    if info.head_dim_k != info.head_dim_v:
        # Ollama's SupportsFlashAttention: K and V heads of one width
        return CacheChoice("f16", f"{info.architecture} has no flash attention (K and V widths)")
    if info.head_dim_k % BLOCK or info.head_dim_v % BLOCK:
        # llama.cpp refuses the context ("block size 32 does not divide n_embd_head_k")
        return CacheChoice("f16", f"head width {info.head_dim_k} is not a multiple of {BLOCK}")
    if info.architecture in NO_QUANTIZED_CACHE:
        return CacheChoice("f16", f"{info.architecture} does not support a quantized cache")
    return CacheChoice(requested)
