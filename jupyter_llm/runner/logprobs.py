"""A sampled token's log-probability and its likeliest alternatives, read
from the context's raw logits: OpenAI's and Ollama's logprob entry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np


class Logprobs:
    """Entries for the tokens sampled from one context's logits."""

    def __init__(self, ctx: Any, n_vocab: int, piece: Callable[[int, bool], bytes]) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab
        self.piece = piece  # (token, special) -> its bytes

    def entry(self, index: int, token: int, top: int) -> dict[str, Any]:
        """The model's log-probability of ``token`` at batch position ``index``
        (log-softmax of the raw logits, before any sampler), with the ``top``
        likeliest tokens."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float64)
        peak = logits.max()
        norm = peak + np.log(np.exp(logits - peak).sum())
        entry = self._token_entry(token, float(logits[token] - norm))
        alternatives: list[dict[str, Any]] = []
        if top > 0:
            best = np.argpartition(-logits, min(top, self.n_vocab - 1))[:top]
            best = best[np.argsort(-logits[best])]
            alternatives = [self._token_entry(int(t), float(logits[t] - norm)) for t in best]
        entry["top_logprobs"] = alternatives
        return entry

    def _token_entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self.piece(token, True)
        return {
            "token": raw.decode(errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }
