"""Which KV cache type a load actually gets (the ``kv_cache_type`` setting).

A quantized V cache needs flash attention in llama.cpp, so, as Ollama does,
``q8_0``/``q4_0`` fall back to ``f16`` (with a reason for the log and
``/api/ps``) where flash attention is off or the model cannot use it. Decided
on the server, before the load, so the memory estimate, the placement and the
runner all use the same type.

The ``batch_invariant`` setting asks that a token's logits not depend on what
else its decode holds (drafts being verified, other requests), so that greedy
output is the same with and without speculation. On llama.cpp's CPU backend
one query's flash attention splits the cells across threads and adds the
parts in another order than a batch's rows do, wherever K and V are one
f16/f32 type and the cache view reaches 512 cells; a batch-invariant load
therefore keeps q8_0 keys beside f16 values (``key_type``), which takes every
query count down the same per-row path. The rest of the mode lives in the
runner (no repacked weights) and its launch (no tiled matmul).
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


INVARIANT_KEY = "q8_0"  # the keys' type of a batch-invariant load whose setting is f16


def key_type(kv_type: str, batch_invariant: bool) -> str:
    """The K cache's type: ``kv_type`` (the V cache's), except that a
    batch-invariant load quantizes f16 keys (see the module docstring; a
    quantized V already keeps attention on the per-row path)."""
    return INVARIANT_KEY if batch_invariant and kv_type == "f16" else kv_type


def asked_cache(kv_type: str, batch_invariant: bool) -> str:
    """The cache a load asked llama.cpp for, as its refusal names it: the
    type ("q8_0"), or the keys' ("q8_0 key") where only they are quantized."""
    keys = key_type(kv_type, batch_invariant)
    return kv_type if keys == kv_type else f"{keys} key"


def choose_batch_invariant(
    requested: bool, cache: CacheChoice, flash_attn: str, info: ModelInfo
) -> tuple[bool, str]:
    """Whether this load can be batch-invariant with ``cache``, and why not:
    the per-row attention path is flash attention's, and its q8_0 keys need
    what a quantized cache needs."""
    if not requested:
        return False, ""
    if flash_attn == "off":
        return False, "batch invariance needs flash attention, which is off"
    if info.float_matrices:
        # llama.cpp's sgemm takes their products from 2 rows, its vector product one
        return False, "batch invariance does not cover f16/f32 weight matrices"
    if cache.kv_type != "f16":
        return True, ""  # a quantized cache: the keys are quantized already
    keys = choose_kv_type(INVARIANT_KEY, flash_attn, info)
    if keys.fallback:
        return False, f"batch invariance needs a q8_0 key cache: {keys.fallback}"
    return True, ""
