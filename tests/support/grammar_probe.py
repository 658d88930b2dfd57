"""llama.cpp's own grammar engine, driven byte by byte: does a GBNF grammar
accept a string? The demo model's vocabulary has one token per byte, so a
string is fed as its UTF-8 bytes and each step asks the grammar sampler
whether that byte may come next; at the end, whether end-of-generation may."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp


class GrammarProbe:
    """The vocabulary of a demo GGUF (loaded vocab-only) and its byte tokens."""

    def __init__(self, gguf: Path) -> None:
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), params)
        assert self.model, gguf
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)

    def close(self) -> None:
        llama_cpp.llama_model_free(self.model)

    def parses(self, grammar: str) -> bool:
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    def accepts(self, grammar: str, text: str) -> bool:
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert sampler, "the grammar does not parse"
        try:
            for byte in text.encode():
                if not self._allowed(sampler, byte):
                    return False
                llama_cpp.llama_sampler_accept(sampler, byte)  # token id == byte value
            return self._allowed(sampler, self.eos)
        finally:
            llama_cpp.llama_sampler_free(sampler)

    @staticmethod
    def _allowed(sampler, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
        array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(data, llama_cpp.llama_token_data_p),
            size=1,
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return data[0].logit != float("-inf")
