"""One request as the batched engine carries it: its own sampler chain (and
grammar), stop strings, text decoder, cancellation and timings.

The engine owns the llama context and the slots; a ``Sequence`` only knows
what was asked and what has happened to it, so any number of them can share
one ``llama_decode``. Runs in the runner process only.
"""

from __future__ import annotations

import codecs
import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from jupyter_llm.runner.context_window import num_keep
from jupyter_llm.runner.protocol import EngineError
from jupyter_llm.runner.stops import StopScanner

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


@dataclass
class Completion:
    """What a finished request reports (durations in nanoseconds)."""

    done_reason: str = "stop"
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    context: list[int] = field(default_factory=list)


@dataclass
class Job:
    """A completion as submitted: the prompt's tokens and where results go."""

    rid: int
    tokens: list[int]
    options: dict[str, Any]
    emit: Callable[[str], None]
    finish: Callable[[Completion], None]
    fail: Callable[[Exception], None]
    cancelled: Callable[[], bool] = lambda: False
    grammar: str | None = None
    shift: bool = True  # at the end of the context: shift it (else stop, "length")
    triggers: Triggers | None = None  # the grammar is lazy: it holds once one fires
    preserve: frozenset[int] = frozenset()  # control tokens rendered as their text
    logprobs: int = -1  # -1: none; else each token's log-probability and this many alternatives
    on_logprob: Callable[[dict[str, Any]], None] = lambda entry: None
    # images by their first position in ``tokens`` (``vision.ImageChunk``); ``tokens``
    # holds marks (negative) there. ``release`` frees them when the job ends.
    images: dict[int, Any] = field(default_factory=dict)
    release: Callable[[], None] = lambda: None

    def spans(self) -> list[tuple[int, int]]:
        """The positions ``[start, end)`` of each image."""
        return sorted((s, s + im.n_tokens) for s, im in self.images.items())

    def next_image(self, position: int) -> int:
        """Where the first image at or after ``position`` starts (else the end)."""
        return min((s for s in self.images if s >= position), default=len(self.tokens))


@dataclass(frozen=True)
class Triggers:
    """What switches a lazy grammar on (llama.cpp's lazy grammar sampler):
    ECMAScript patterns matched against the output so far (the grammar is
    fed from the first capture group, or the match), and token ids (fed
    from the token on)."""

    patterns: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()


def grammar_sampler(vocab: Any, grammar: str, triggers: Triggers | None) -> Any:
    """A native grammar sampler; a lazy one with ``triggers``. None if the
    grammar does not parse."""
    if triggers is None:
        return llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    patterns = (ctypes.c_char_p * max(1, len(triggers.patterns)))(
        *[p.encode() for p in triggers.patterns]
    )
    tokens = (llama_cpp.llama_token * max(1, len(triggers.tokens)))(*triggers.tokens)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        vocab,
        grammar.encode(),
        b"root",
        patterns,
        len(triggers.patterns),
        tokens,
        len(triggers.tokens),
    )


def build_sampler(
    vocab: Any,
    n_vocab: int,
    n_ctx: int,
    opts: dict[str, Any],
    grammar: str | None,
    triggers: Triggers | None = None,
) -> Any:
    """A native sampler chain for ``opts`` (Ollama's options, defaults filled),
    with ``grammar`` first (lazy with ``triggers``)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    if grammar:
        g = grammar_sampler(vocab, grammar, triggers)
        if not g:
            llama_cpp.llama_sampler_free(chain)
            raise EngineError("invalid grammar")
        add(chain, g)
    repeat, freq, presence = (
        float(opts["repeat_penalty"]),
        float(opts["frequency_penalty"]),
        float(opts["presence_penalty"]),
    )
    if repeat != 1.0 or freq != 0.0 or presence != 0.0:
        last_n = int(opts["repeat_last_n"])
        last_n = n_ctx if last_n == -1 else last_n
        add(chain, llama_cpp.llama_sampler_init_penalties(n_vocab, last_n, repeat, freq, presence))
    temperature = float(opts["temperature"])
    if temperature <= 0:
        add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    seed = int(opts["seed"])
    seed = seed if seed >= 0 else DEFAULT_SEED
    mirostat = int(opts["mirostat"])
    if mirostat in (1, 2):  # mirostat replaces top-k/top-p/typical sampling
        tau, eta = float(opts["mirostat_tau"]), float(opts["mirostat_eta"])
        add(chain, llama_cpp.llama_sampler_init_temp(temperature))
        if mirostat == 1:
            add(chain, llama_cpp.llama_sampler_init_mirostat(n_vocab, seed, tau, eta, 100))
        else:
            add(chain, llama_cpp.llama_sampler_init_mirostat_v2(seed, tau, eta))
        return chain
    if int(opts["top_k"]) > 0:
        add(chain, llama_cpp.llama_sampler_init_top_k(int(opts["top_k"])))
    if float(opts["top_p"]) < 1.0:
        add(chain, llama_cpp.llama_sampler_init_top_p(float(opts["top_p"]), 1))
    if float(opts["typical_p"]) < 1.0:
        add(chain, llama_cpp.llama_sampler_init_typical(float(opts["typical_p"]), 1))
    if float(opts["min_p"]) > 0.0:
        add(chain, llama_cpp.llama_sampler_init_min_p(float(opts["min_p"]), 1))
    add(chain, llama_cpp.llama_sampler_init_temp(temperature))
    add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain


class Sequence:
    """A job in a slot: prompt feeding, then generation, until it finishes."""

    def __init__(self, job: Job, opts: dict[str, Any], chain: Any) -> None:
        self.job = job
        self.opts = opts
        self.chain = chain
        self.limit = int(opts["num_predict"])
        self.num_keep = num_keep(opts)
        stop = opts["stop"]
        self.stops = StopScanner([stop] if isinstance(stop, str) else list(stop or []))
        self.slot = -1
        self.fed = 0  # prompt tokens whose KV entries are in the slot
        self.next_token: int | None = None  # sampled, not yet decoded
        self.generated: list[int] = []
        self.reason = ""  # set when finished
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.prompt_ns = 0
        self.started_ns = time.perf_counter_ns()
        self.generating_since = 0

    @property
    def prompt_done(self) -> bool:
        return self.fed >= len(self.job.tokens)

    def accept(self, token: int, piece: bytes, eog: bool) -> bool:
        """Take a sampled token; True while the sequence goes on."""
        if eog:
            self.reason = "stop"
            return False
        self.generated.append(token)
        text = self._decoder.decode(piece)
        if text:
            if self.stops:
                text, hit = self.stops.feed(text)
                if text:
                    self.job.emit(text)
                if hit:
                    self.reason = "stop"
                    return False
            else:
                self.job.emit(text)
        if len(self.generated) == self.limit:
            self.reason = "length"
            return False
        self.next_token = token
        return True

    def result(self, reason: str, evaluated: int) -> Completion:
        """The report, once finished; text still held back goes out unless a
        stop string ended it. ``evaluated``: prompt tokens really decoded."""
        tail = self.stops.pending + self._decoder.decode(b"", final=True)
        if tail and reason != "stop":
            self.job.emit(tail)
        now = time.perf_counter_ns()
        prompt = self.job.tokens
        done = self.prompt_done
        return Completion(
            done_reason=reason,
            prompt_eval_count=len(prompt) if done else evaluated,
            prompt_eval_duration=self.prompt_ns,
            eval_count=len(self.generated),
            eval_duration=now - self.generating_since if self.generating_since else 0,
            context=[
                t for t in (prompt + self.generated if done else prompt[: self.fed]) if t >= 0
            ],
        )

    def free(self) -> None:
        if self.chain is not None:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
        self.job.release()  # its images (idempotent)
