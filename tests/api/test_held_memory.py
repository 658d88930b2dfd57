"""What a runner makes after its load counts in ``/api/ps`` and in what the
scheduler holds: the embeddings' context, made on the first embed (about
140 MiB on Gemma 3 270M, counted nowhere before), told by the embed's end."""

from __future__ import annotations

import json


async def ps_model(jp_fetch) -> dict:
    (model,) = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    return model


async def test_the_embedding_context_counts_once_it_is_made(jp_fetch, installed_model):
    options = {"num_predict": 1}
    body = {"model": installed_model, "prompt": "hi", "stream": False, "options": options}
    await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    loaded = await ps_model(jp_fetch)
    body = {"model": installed_model, "input": ["hello world", "the cat sat"]}
    await jp_fetch("llm", "api", "embed", method="POST", body=json.dumps(body))
    held = await ps_model(jp_fetch)
    cpu = {a["device"]: a for a in held["allocations"]}["cpu"]
    was = {a["device"]: a for a in loaded["allocations"]}["cpu"]
    assert held["size"] > loaded["size"]
    assert cpu["graph"] > was["graph"] and cpu["kv_cache"] > was["kv_cache"]
    assert cpu["weights"] == was["weights"]  # the weights are shared
    again = await ps_model(jp_fetch)  # nothing new made: the same
    await jp_fetch("llm", "api", "embed", method="POST", body=json.dumps(body))
    assert (await ps_model(jp_fetch))["size"] == again["size"]
