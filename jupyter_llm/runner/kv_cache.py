"""The KV cache's ggml type for the context (``LoadParams.kv_cache_type``).

The server already chose the type (memory/kv_cache.py); the runner only
refuses a quantized cache with flash attention off, since llama.cpp would
then fail to create the context (a quantized V cache needs flash attention).
"""

from __future__ import annotations

import logging

import llama_cpp

from jupyter_llm.runner.protocol import LoadParams

log = logging.getLogger(__name__)

GGML_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}


def cache_type(params: LoadParams) -> int:
    """The ggml type of both K and V."""
    if params.kv_cache_type != "f16" and params.flash_attn == "off":
        log.warning("KV cache f16 instead of %s: flash attention is off", params.kv_cache_type)
        return GGML_TYPES["f16"]
    return GGML_TYPES[params.kv_cache_type]
