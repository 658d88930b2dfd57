"""Decode throughput and per-request overhead: in-process llama_cpp vs. our HTTP API
(and llama.cpp's own ``llama-server`` when ``LLAMA_SERVER`` names one).

Every side runs at the defaults its user gets, thread count included (ours:
the physical cores the runner may use; ``llama-server``: its physical cores;
``llama_cpp.Llama``: half the logical CPUs), and the benchmark prints the
threads each side used. One run measures, on the same generated model
(n_embd 512, 8 layers, f32, temperature 0):

* tokens/s of in-process ``llama_cpp.Llama.generate`` vs tokens/s streamed
  through ``/llm/api/generate`` (and, when the server has it, through
  ``/llm/v1/chat/completions``), and through ``llama-server``'s ``/completion``,
  measured from first to last token at the client;
* latency of a 1-token generate on a warm model, in-process vs over HTTP.

Rounds alternate between the sides so drifting machine load hits all of them.
Prints medians and the ratios; exits non-zero when a target is missed. The
ratio to in-process is judged only when both use the same thread count (it
measures our HTTP path's overhead, not a default); the ratio to llama-server
is judged whenever it runs (>= 0.95x, the project's goal).

    .venv/bin/python benchmarks/decode.py [--tokens 256] [--rounds 5]
    LLAMA_SERVER=/path/to/llama-server .venv/bin/python benchmarks/decode.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

PROMPT = "hello"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def logged_number(log: Path, pattern: str) -> int | None:
    """The first number ``pattern`` captures in a server's log file."""
    match = re.search(pattern, log.read_text(errors="replace"))
    return int(match.group(1)) if match else None


def wait_until_up(client: httpx.Client, url: str, name: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if client.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start")


class InProcess:
    def __init__(self, path: Path, n_ctx: int) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, verbose=False)
        self.threads = self.llm.n_threads
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
    def __init__(self, models: Path, n_ctx: int, log: Path) -> None:
        self.port, self.token = free_port(), secrets.token_hex(16)
        # the defaults a user gets: no thread count from the environment either
        env = {k: v for k, v in os.environ.items() if k != "JUPYTER_LLM_NUM_THREADS"}
        env["JUPYTER_LLM_MODELS"] = str(models)
        self.log, self._log_file = log, log.open("wb")
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
            stderr=self._log_file,
        )
        self.runner_rates: list[float] = []
        self.base = f"http://127.0.0.1:{self.port}/llm"
        self.client = httpx.Client(headers={"Authorization": f"token {self.token}"}, timeout=120)
        self.options = {"temperature": 0, "repeat_penalty": 1.0, "num_ctx": n_ctx}
        wait_until_up(self.client, f"{self.base}/api/version", "the Jupyter server")
        self.client.post(
            f"{self.base}/api/generate", json={"model": "bench", "options": self.options}
        )
        # the server logs the runner's thread count once per load
        self.threads = logged_number(self.log, r"(\d+) CPU threads")

    def close(self) -> None:
        self.client.close()
        self.server.terminate()
        self.server.wait(30)
        self._log_file.close()

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


class LlamaServer:
    """llama.cpp's own server on the same model, every setting at its default
    but the context size."""

    def __init__(self, binary: str, path: Path, n_ctx: int, log: Path) -> None:
        port = str(free_port())
        self.log, self._log_file = log, log.open("wb")
        self.server = subprocess.Popen(
            [binary, "-m", str(path), "-c", str(n_ctx), "--host", "127.0.0.1", "--port", port],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(timeout=120)
        wait_until_up(self.client, f"{self.base}/health", "llama-server")
        self.threads = logged_number(self.log, r"n_threads = (\d+)")

    def close(self) -> None:
        self.client.close()
        self.server.terminate()
        self.server.wait(30)
        self._log_file.close()

    def decode_rate(self, n: int) -> float:
        body = {
            "prompt": PROMPT,
            "n_predict": n,
            "temperature": 0,
            "repeat_penalty": 1.0,
            "stream": True,
        }
        times, count = [], 0
        with self.client.stream("POST", f"{self.base}/completion", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("stop"):
                    count = int(chunk.get("tokens_predicted", len(times)))
                    break
                if chunk.get("content"):
                    times.append(time.perf_counter())
        return (count - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


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
        http = OverHTTP(models, n_ctx, Path(tmp) / "jupyter.log")
        anchor: LlamaServer | None = None
        try:
            if binary := os.environ.get("LLAMA_SERVER"):
                anchor = LlamaServer(binary, path, n_ctx, Path(tmp) / "llama-server.log")
            local.decode_rate(16), http.decode_rate(16)  # warm up both
            if anchor:
                anchor.decode_rate(16)
            rates: dict[str, list[float]] = {"local": [], "http": [], "openai": [], "anchor": []}
            for i in range(args.rounds):
                # alternate which side goes first, so drift in machine load cancels out
                runs = [
                    ("local", local.decode_rate),
                    ("http", http.decode_rate),
                    ("openai", http.openai_decode_rate),
                ]
                if anchor:
                    runs.append(("anchor", anchor.decode_rate))
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
            if anchor:
                anchor.close()

    med = {k: statistics.median(v) for k, v in rates.items() if v}
    overhead_ms = (statistics.median(lat["http"]) - statistics.median(lat["local"])) * 1000
    print(
        f"model: n_embd 512, 8 layers, f32, {args.tokens} tokens, temperature 0, "
        f"{args.rounds} rounds, every side at its default threads"
    )
    print(f"threads: in-process Llama {local.threads} (batch {local.llm.n_threads_batch}),", end="")
    print(f" our runner {http.threads}", end="")
    print(
        f", llama-server {anchor.threads}" if anchor else " (LLAMA_SERVER unset: no llama-server)"
    )
    print(f"in-process Llama.generate : {med['local']:8.1f} tokens/s")
    print(f"  (our runner, as it reports: {statistics.median(http.runner_rates):6.1f} tokens/s)")
    if anchor:
        print(f"llama-server /completion  : {med['anchor']:8.1f} tokens/s")
    # the ratio to in-process measures our HTTP path only when the threads match
    same_threads = http.threads == local.threads
    if not same_threads:
        print(
            "  in-process runs other threads than our runner: ratios to it and the overhead"
            " are not judged"
        )
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
        ok = ok and (paired >= 0.97 or not same_threads)
        if anchor:
            vs = statistics.median(a / b for a, b in zip(rates[name], rates["anchor"], strict=True))
            print(
                f"  vs llama-server: {vs:.3f}x (ratio of medians {med[name] / med['anchor']:.3f}x)"
            )
            ok = ok and vs >= 0.95
    print(
        f"1-token generate, warm    : in-process {statistics.median(lat['local']) * 1000:.2f} ms,"
        f" HTTP {statistics.median(lat['http']) * 1000:.2f} ms, overhead {overhead_ms:.2f} ms"
    )
    ok = ok and (overhead_ms < 10 or not same_threads)
    targets = "(>= 0.97x in-process, < 10 ms" + (", >= 0.95x llama-server)" if anchor else ")")
    print(f"targets {targets}:", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
