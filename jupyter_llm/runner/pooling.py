"""How an embedding is pooled and normalised: pure policy, as Ollama does it.

* Pooling is the model's own ``<arch>.pooling_type`` (mean, CLS or last
  token). A model that declares none (a generative model) is pooled by its
  last token: what Ollama's llama.cpp runner returned for such a model (the
  hidden state of the last token), and the one summary a causal model has.
  A reranker (rank pooling) gives scores, not embeddings: a clear 400.
* ``/api/embed`` and ``/v1/embeddings`` are L2-normalised; with
  ``dimensions`` the vector is cut and normalised again (the same as
  normalising the cut vector). A NaN or infinite value is an error.
* The legacy ``/api/embeddings`` returns what Ollama's does for the model:
  normalised, except where Ollama keeps the raw runner output (``legacy_normalizes``).
"""

from __future__ import annotations

import math

import llama_cpp

from jupyter_llm.runner.protocol import InputError

POOLING_NAMES = {
    llama_cpp.LLAMA_POOLING_TYPE_NONE: "none",
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
    llama_cpp.LLAMA_POOLING_TYPE_RANK: "rank",
}


def embedding_pooling(declared: int) -> int:
    """The pooling an embedding context uses, from what llama.cpp read from
    the model (``llama_pooling_type`` of a context left unspecified)."""
    if declared in (
        llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        llama_cpp.LLAMA_POOLING_TYPE_CLS,
        llama_cpp.LLAMA_POOLING_TYPE_LAST,
    ):
        return declared
    if declared == llama_cpp.LLAMA_POOLING_TYPE_RANK:
        raise InputError("this model is a reranker (rank pooling): it gives scores, not embeddings")
    return llama_cpp.LLAMA_POOLING_TYPE_LAST


def legacy_normalizes(
    arch: str, declares_pooling: bool, tokenizer: str, normalize_embeddings: bool | None
) -> bool:
    """Whether Ollama's legacy ``/api/embeddings`` normalises this model's
    vectors. It keeps the raw output where its older runners returned it raw:
    a model without a pooling type, a bert model with another tokenizer than
    WordPiece or ``bert.normalize_embeddings`` false, a nomic-bert model
    unless ``normalize_embeddings`` is true. Everything else is normalised."""
    if not declares_pooling:
        return False
    if arch == "bert":
        return tokenizer in ("", "bert") and normalize_embeddings is not False
    if arch in ("nomic-bert", "nomic-bert-moe"):
        return normalize_embeddings is True
    return True


def finish_vector(vector: list[float], dimensions: int | None, normalize: bool) -> list[float]:
    """Cut to ``dimensions`` and L2-normalise (a zero vector stays zero)."""
    if not all(math.isfinite(v) for v in vector):
        raise InputError("embedding contains NaN or Inf values")
    if dimensions:
        vector = vector[:dimensions]
    if normalize:
        norm = max(math.sqrt(sum(v * v for v in vector)), 1e-12)
        vector = [v / norm for v in vector]
    return vector


def fit_tokens(full: list[int], plain: list[int], limit: int) -> list[int]:
    """``full`` (the input with the model's special tokens) cut to ``limit``
    tokens, keeping the special tokens around it: a CLS-pooled model still
    starts with CLS, a model that pools its final EOS still ends with it.
    ``plain`` is the same input without special tokens; where it is not found
    inside ``full``, the tail is simply cut."""
    if len(full) <= limit:
        return full
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            head, tail = full[:start], full[start + len(plain) :]
            room = limit - len(head) - len(tail)
            if room > 0:
                return head + plain[:room] + tail
            break
    return full[:limit]
