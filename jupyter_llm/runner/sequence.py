"""One request as the batched engine carries it: its own sampler (a native
chain, or one held to a grammar: ``constrained``), stop strings, text
decoder, cancellation and timings.

The engine owns the llama context and the slots; a ``Sequence`` only knows
what was asked and what has happened to it, so any number of them can share
one ``llama_decode``. Runs in the runner process only.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from jupyter_llm.runner.constrained import Candidates, GrammarSampler, TokenTable, Triggers
from jupyter_llm.runner.context_window import num_keep
from jupyter_llm.runner.grammar_trie import matches_text
from jupyter_llm.runner.grammar_walk import first_pick, penalties, pick_need, walk_need
from jupyter_llm.runner.protocol import Done, InputError
from jupyter_llm.runner.stops import StopScanner

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


@dataclass
class Job:
    """A completion as submitted: the prompt's tokens and where results go."""

    rid: int
    tokens: list[int]
    options: dict[str, Any]
    emit: Callable[[str], None]
    finish: Callable[[Done], None]
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
    priority: str = "interactive"  # "batch": may be paused for interactive work (``pausing``)

    def spans(self) -> list[tuple[int, int]]:
        """The positions ``[start, end)`` of each image."""
        return sorted((s, s + im.n_tokens) for s, im in self.images.items())

    def next_image(self, position: int) -> int:
        """Where the first image at or after ``position`` starts (else the end)."""
        return min((s for s in self.images if s >= position), default=len(self.tokens))


class NativeSampler:
    """A request without a grammar: its chain samples and accepts.

    llama.cpp's ``llama_sampler_sample`` copies every logit into a candidate
    array first (262k for Gemma: about 0.4 ms a token on 2 cores, as much as
    the rest of the step's Python), and a penalty sampler looks each of them
    up in its window (1.5 ms more). Greedy or top-k, with or without
    penalties that only lower logits (the default options, and
    ``repeat_penalty``), the pick is read from the ``need`` best logits in
    place instead (``grammar_walk.pick_need``, ``first_pick``: the same
    token, drawn from the same random state; the reasons are that module's).
    Other chains keep the native call (``need`` 0)."""

    def __init__(self, chain: Any, candidates: Candidates | None = None, need: int = 0) -> None:
        self.chain, self.candidates = chain, candidates
        self.need = need if candidates is not None else 0

    def sample(self, ctx: Any, index: int) -> int:
        if self.need:
            assert self.candidates is not None
            token = first_pick(self.chain, self.need, self.candidates.logits(ctx, index))
            if token is not None:
                llama_cpp.llama_sampler_accept(self.chain, token)
                return token
        return int(llama_cpp.llama_sampler_sample(self.chain, ctx, index))

    def free(self) -> None:
        if self.chain is not None:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None


Sampler = NativeSampler | GrammarSampler


def make_sampler(
    table: TokenTable,
    candidates: Candidates,
    n_ctx: int,
    opts: dict[str, Any],
    grammar: str | None,
    triggers: Triggers | None = None,
    preserve: frozenset[int] = frozenset(),
) -> Sampler:
    """The request's sampler: its chain for ``opts`` (Ollama's options,
    defaults filled), held to ``grammar`` (lazy with ``triggers``) if any.
    ``InputError`` for a grammar llama.cpp refuses (the request made it);
    ``EngineError`` for a trigger that does not compile."""
    chain = build_chain(table.n_vocab, n_ctx, opts)
    if not grammar:
        return NativeSampler(chain, candidates, pick_need(opts, table.n_vocab, n_ctx))
    native = llama_cpp.llama_sampler_init_grammar(table.vocab, grammar.encode(), b"root")
    if not native:  # the request's format, schema or tools made it: the request's error
        llama_cpp.llama_sampler_free(chain)
        raise InputError(
            "llama.cpp refused the grammar built from this request's format or tools "
            "(its tools' repeats nested in repeats, past 2,000 rules, are the known "
            "cause); simplify the schema or its patterns"
        )
    try:
        need = walk_need(
            opts, table.n_vocab
        )  # resample by walking the best candidates (``grammar_walk``)
        by_text = matches_text(grammar)  # its full pass may go by the vocabulary's trie
        read = pick_need(opts, table.n_vocab, n_ctx)  # the first pick's best logits
        return GrammarSampler(
            table,
            candidates,
            chain,
            native,
            triggers,
            preserve,
            need=need,
            read=read,
            by_text=by_text,
        )
    except Exception:
        llama_cpp.llama_sampler_free(native)
        llama_cpp.llama_sampler_free(chain)
        raise


def build_chain(n_vocab: int, n_ctx: int, opts: dict[str, Any]) -> Any:
    """A native sampler chain for ``opts``: penalties, then the pick."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    penalised = penalties(opts, n_ctx)
    if penalised is not None:
        repeat, freq, presence, window = penalised
        add(chain, llama_cpp.llama_sampler_init_penalties(n_vocab, window, repeat, freq, presence))
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

    def __init__(self, job: Job, opts: dict[str, Any], sampler: Sampler) -> None:
        self.job = job
        self.opts = opts
        self.sampler = sampler
        self.limit = int(opts["num_predict"])
        self.num_keep = num_keep(opts)
        stop = opts["stop"]
        self.stops = StopScanner([stop] if isinstance(stop, str) else list(stop or []))
        self.slot = -1
        self.fed = 0  # prompt tokens whose KV entries are in the slot
        self.reused = 0  # of those, the ones its slot's cache already held
        self.prompt_cache = ""  # where: "slot", or "disk" when restored (runner.prompt_disk)
        self.next_token: int | None = None  # sampled, not yet decoded
        self.generated: list[int] = []
        self.reason = ""  # set when finished
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.prompt_ns = 0
        self.started_ns = time.perf_counter_ns()
        self.generating_since = 0
        self.drafting: Any = None  # ``speculative.Drafting`` once it drafts

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

    def result(self, reason: str, evaluated: int, threads: int) -> Done:
        """The report, once finished; text still held back goes out unless a
        stop string ended it. ``evaluated``: prompt tokens really decoded;
        ``threads``: the engine's CPU threads now."""
        tail = self.stops.pending + self._decoder.decode(b"", final=True)
        if tail and reason != "stop":
            self.job.emit(tail)
        now = time.perf_counter_ns()
        prompt = self.job.tokens
        done = self.prompt_done
        return Done(
            done_reason=reason,
            threads=threads,
            stop_sequence=self.stops.hit,
            prompt_eval_count=len(prompt) if done else evaluated,
            prompt_cached=self.reused,
            prompt_cache=self.prompt_cache if self.reused else "",
            draft_tokens=self.drafting.drafted if self.drafting else 0,
            draft_accepted=self.drafting.accepted if self.drafting else 0,
            prompt_eval_duration=self.prompt_ns,
            eval_count=len(self.generated),
            eval_duration=now - self.generating_since if self.generating_since else 0,
            context=[
                t for t in (prompt + self.generated if done else prompt[: self.fed]) if t >= 0
            ],
        )

    def free(self) -> None:
        self.sampler.free()  # idempotent
        self.job.release()  # its images (idempotent)
