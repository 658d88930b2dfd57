"""The KV cache's ggml type for the context (``LoadParams.kv_cache_type``).

The server already chose the type (memory/kv_cache.py); the runner refuses a
quantized cache with flash attention off, since llama.cpp would then fail to
create the context (a quantized V cache needs flash attention), and falls
back to f16 where llama.cpp still refuses the quantized context (a backend
without flash attention for this model, a head width the server's rule did
not foresee): the load goes on, with the reason in the runner's log and in
its load reply (``kv_cache_fallback``, shown by /api/ps).
"""

from __future__ import annotations

import logging
from typing import Any

import llama_cpp

from jupyter_llm.memory.kv_cache import asked_cache, key_type
from jupyter_llm.runner.protocol import LoadParams

log = logging.getLogger(__name__)

GGML_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}


def cache_types(params: LoadParams) -> tuple[int, int]:
    """The ggml types of K and V: the setting's, with q8_0 keys where the load
    is batch-invariant (memory.kv_cache.key_type)."""
    if params.flash_attn == "off":
        if params.kv_cache_type != "f16":
            log.warning("KV cache f16 instead of %s: flash attention is off", params.kv_cache_type)
        return GGML_TYPES["f16"], GGML_TYPES["f16"]
    keys = key_type(params.kv_cache_type, params.batch_invariant)
    return GGML_TYPES[keys], GGML_TYPES[params.kv_cache_type]


def open_context(llama_model: Any, cp: Any, params: LoadParams) -> tuple[Any, str]:
    """llama.cpp's context for ``cp``, and why its cache is f16 ("" when it
    has the type asked for). One retry at most: a quantized cache llama.cpp
    refuses becomes f16; a null context then (or on f16) is the caller's
    failure."""
    ctx = llama_cpp.llama_init_from_model(llama_model, cp)
    if ctx or cp.type_k == cp.type_v == GGML_TYPES["f16"]:
        return ctx, ""
    asked = asked_cache(params.kv_cache_type, params.batch_invariant)
    reason = f"llama.cpp refused a {asked} cache for this model"
    log.warning("KV cache f16 instead of %s: %s", asked, reason)
    cp.type_k = cp.type_v = GGML_TYPES["f16"]
    return llama_cpp.llama_init_from_model(llama_model, cp), reason
