"""Decode rate beside a busy neighbour: a notebook's kernel computing on one
of the machine's cores while a model streams (``runner.thread_tuning``).

Two runners on the same model: one at the default thread count (the
physical cores it may use, adapted while other work holds them) and one with
that count set (``num_thread``, kept as set: what the default was before
thread tuning, and what llama.cpp does). Each round streams one answer from
each, quiet and then beside ``--neighbours`` processes spinning in pure
Python (a kernel's pandas loop looks the same to the scheduler). With
``LLAMA_SERVER`` set, llama-server at its defaults streams too, in both
settings. The rate is the runner's own (``eval_count / eval_duration``;
llama-server's ``timings.predicted_per_second``), every option at its
default on both sides (a fixed seed).

    [LLAMA_SERVER=.../llama-server] .venv/bin/python benchmarks/busy_neighbour.py \
        [--gemma] [--rounds N] [--tokens N] [--neighbours N]

Targets: beside the neighbour, the default at least 1.3x the set count;
quiet, at least 0.97x it (the probes' cost).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from decode import model_file
from grammar import post, start_server

from jupyter_llm.runner.cpu_threads import default_threads
from jupyter_llm.runner.protocol import Complete
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

PROMPT = "Write a long story about a lighthouse keeper."
OPTIONS = {"seed": 1}  # every other option at its default, drafts included


@contextlib.contextmanager
def neighbours(count: int) -> Iterator[None]:
    """``count`` processes spinning in Python until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def rate(runner, n: int) -> float:
    done = {}
    request = Complete(prompt=PROMPT, options={**OPTIONS, "num_predict": n})
    async for batch in runner.complete(request):
        for message in batch:
            if message["type"] == "done":
                done = message
    return done["eval_count"] / done["eval_duration"] * 1e9


async def server_rate(url: str, n: int) -> float:
    body = {"prompt": PROMPT, "n_predict": n, "seed": 1, "cache_prompt": False}
    reply = await asyncio.to_thread(post, url + "/completion", body)
    return float(reply["timings"]["predicted_per_second"])


async def main(args: argparse.Namespace) -> int:
    cores = default_threads()
    with tempfile.TemporaryDirectory() as tmp:
        path, model = model_file(Path(tmp), args.gemma)
        tuned = await start_runner_with(LoadSpec(path=str(path), n_ctx=1024), load_timeout=120)
        fixed = await start_runner_with(
            LoadSpec(path=str(path), n_ctx=1024, n_threads=cores), load_timeout=120
        )
        binary = os.environ.get("LLAMA_SERVER")
        server = start_server(binary, path) if binary else None
        rates: dict[str, list[float]] = {}
        try:
            await rate(tuned, 16)
            await rate(fixed, 16)
            for _ in range(args.rounds):
                for setting, count in (("quiet", 0), ("busy", args.neighbours)):
                    with neighbours(count):
                        sides = {"default": tuned, "set": fixed}
                        for name, runner in sides.items():
                            value = await rate(runner, args.tokens)
                            rates.setdefault(f"{setting}, {name}", []).append(value)
                        if server:
                            value = await server_rate(server[1], args.tokens)
                            rates.setdefault(f"{setting}, llama-server", []).append(value)
                print({k: round(v[-1], 1) for k, v in rates.items()}, flush=True)
        finally:
            await tuned.close()
            await fixed.close()
            if server:
                server[0].kill()
                server[0].wait()
    return report(model, cores, args, rates)


def report(model: str, cores: int, args: argparse.Namespace, rates: dict) -> int:
    def ratio(a: str, b: str) -> float:  # the median of each round's ratio
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    print(
        f"model: {model}; {cores} threads by default (set on the other runner);"
        f" {args.tokens} tokens, options at their defaults; {args.neighbours} busy neighbour(s)"
    )
    for name, values in rates.items():
        print(f"{name:22s}: {statistics.median(values):6.1f} tokens/s  {values}")
    busy, quiet = ratio("busy, default", "busy, set"), ratio("quiet, default", "quiet, set")
    print(f"busy,  default / set: {busy:.3f}x (target >= 1.3x)")
    print(f"quiet, default / set: {quiet:.3f}x (target >= 0.97x)")
    if "busy, llama-server" in rates:
        print(f"busy,  default / llama-server: {ratio('busy, default', 'busy, llama-server'):.3f}x")
        print(
            f"quiet, default / llama-server: {ratio('quiet, default', 'quiet, llama-server'):.3f}x"
        )
    met = busy >= 1.3 and quiet >= 0.97
    print("targets:", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gemma", action="store_true", help="the real Gemma 3 270M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--neighbours", type=int, default=1)
    sys.exit(asyncio.run(main(parser.parse_args())))
