"""Decode throughput and per-request overhead: in-process llama_cpp vs. our HTTP API.

One run measures, on the same generated model (n_embd 512, 8 layers, f32,
2 threads, temperature 0):

* tokens/s of in-process ``llama_cpp.Llama.generate`` vs tokens/s streamed
  through ``/llm/api/generate`` (and, when the server has it, through
  ``/llm/v1/chat/completions``), measured from first to last token at the client;
* latency of a 1-token generate on a warm model, in-process vs over HTTP.

Rounds alternate between the two sides so drifting machine load hits both.
Prints medians and the ratios; exits non-zero when a target is missed.

    .venv/bin/python benchmarks/decode.py [--tokens 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

THREADS = 2
PROMPT = "hello"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InProcess:
    def __init__(self, path: Path, n_ctx: int) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            verbose=False,
        )
        self.prompt = self.llm.tokenize(PROMPT.encode(), add_bos=False)

    def decode_rate(self, n: int) -> float:
        times = []
        for i, _ in enumerate(self.llm.generate(self.prompt, temp=0.0, repeat_penalty=1.0)):
            times.append(time.perf_counter())
            if i + 1 >= n:
                break
        return (len(times) - 1) / (times[-1] - times[0])

    def one_token_latency(self) -> float:
        start = time.perf_counter()
        tokens = self.llm.tokenize(PROMPT.encode(), add_bos=False)
        for _ in self.llm.generate(tokens, temp=0.0, repeat_penalty=1.0):
            break
        return time.perf_counter() - start


class OverHTTP:
    def __init__(self, models: Path, n_ctx: int) -> None:
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = {**os.environ, "JUPYTER_LLM_MODELS": str(models), "JUPYTER_LLM_NUM_THREADS": "2"}
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_server",
                "--no-browser",
                f"--port={self.port}",
                "--ip=127.0.0.1",
                "--allow-root",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={models}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.runner_rates: list[float] = []
        self.base = f"http://127.0.0.1:{self.port}/llm"
        self.client = httpx.Client(headers={"Authorization": f"token {self.token}"}, timeout=120)
        self.options = {"temperature": 0, "repeat_penalty": 1.0, "num_ctx": n_ctx}
        for _ in range(300):
            try:
                if self.client.get(f"{self.base}/api/version").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the Jupyter server did not start")
        self.client.post(
            f"{self.base}/api/generate", json={"model": "bench", "options": self.options}
        )

    def close(self) -> None:
        self.client.close()
        self.server.terminate()
        self.server.wait(30)

    def decode_rate(self, n: int) -> float:
        body = {
            "model": "bench",
            "prompt": PROMPT,
            "raw": True,
            "options": {**self.options, "num_predict": n},
        }
        times, count = [], 0
        with self.client.stream("POST", f"{self.base}/api/generate", json=body) as r:
            for line in r.iter_lines():
                chunk = json.loads(line)
                if chunk.get("done"):
                    count = chunk["eval_count"]
                    self.runner_rates.append(count / chunk["eval_duration"] * 1e9)
                    break
                times.append(time.perf_counter())
        # chunks can carry more than one token when the client lags: count tokens
        return (count - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0

    def openai_decode_rate(self, n: int) -> float | None:
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": n,
            "temperature": 0,
        }
        times, count = [], 0
        with self.client.stream("POST", f"{self.base}/v1/chat/completions", json=body) as r:
            if r.status_code == 404:
                return None
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    count = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
        # an SSE event can carry several tokens when the client lags: count tokens
        return (count - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0

    def one_token_latency(self) -> float:
        body = {
            "model": "bench",
            "prompt": PROMPT,
            "raw": True,
            "stream": False,
            "options": {**self.options, "num_predict": 1},
        }
        start = time.perf_counter()
        r = self.client.post(f"{self.base}/api/generate", json=body)
        r.raise_for_status()
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--latency-samples", type=int, default=40)
    args = parser.parse_args()
    n_ctx = 1024

    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
        path = write_demo_model(Path(tmp) / "bench.gguf", spec)
        store = ModelStore(models)
        store.create("bench", {"bench.gguf": store.add_blob_from_file(path)})

        local = InProcess(path, n_ctx)
        http = OverHTTP(models, n_ctx)
        try:
            local.decode_rate(16), http.decode_rate(16)  # warm up both
            rates: dict[str, list[float]] = {"local": [], "http": [], "openai": []}
            for i in range(args.rounds):
                # alternate which side goes first, so drift in machine load cancels out
                runs = [
                    ("local", local.decode_rate),
                    ("http", http.decode_rate),
                    ("openai", http.openai_decode_rate),
                ]
                for name, measure in runs if i % 2 == 0 else runs[::-1]:
                    time.sleep(0.5)  # let the other side's spinning threads go idle
                    if (rate := measure(args.tokens)) is not None:
                        rates[name].append(rate)
            lat: dict[str, list[float]] = {"local": [], "http": []}
            for _ in range(args.latency_samples):
                lat["local"].append(local.one_token_latency())
                lat["http"].append(http.one_token_latency())
        finally:
            http.close()

    med = {k: statistics.median(v) for k, v in rates.items() if v}
    overhead_ms = (statistics.median(lat["http"]) - statistics.median(lat["local"])) * 1000
    print(
        f"model: n_embd 512, 8 layers, f32, {THREADS} threads, {args.tokens} tokens, "
        f"temperature 0, {args.rounds} rounds"
    )
    print(f"in-process Llama.generate : {med['local']:8.1f} tokens/s")
    print(f"  (our runner, as it reports: {statistics.median(http.runner_rates):6.1f} tokens/s)")
    ok = True
    for name, label in (
        ("http", "HTTP /api/generate stream"),
        ("openai", "HTTP /v1/chat/completions"),
    ):
        if name not in med:
            continue
        # judged on the median of per-round ratios (each pair measured back to
        # back, so drifting machine load cancels); the ratio of medians is shown
        # as a check on how noisy the run was
        paired = statistics.median(a / b for a, b in zip(rates[name], rates["local"], strict=True))
        print(f"{label} : {med[name]:8.1f} tokens/s   ratio {paired:.3f}x", end="")
        print(f" (ratio of medians {med[name] / med['local']:.3f}x)")
        ok = ok and paired >= 0.97
    print(
        f"1-token generate, warm    : in-process {statistics.median(lat['local']) * 1000:.2f} ms,"
        f" HTTP {statistics.median(lat['http']) * 1000:.2f} ms, overhead {overhead_ms:.2f} ms"
    )
    ok = ok and overhead_ms < 10
    print("targets (>= 0.97x, < 10 ms):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
