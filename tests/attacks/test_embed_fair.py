"""Attack 7: ``/api/embed`` with 300 inputs and ``dimensions: 1`` left another
user's stream without a token for 10 s: the bound counted values, not
inputs, and one embed request ran whole in the runner. Now inputs
(``EMBED_INPUTS``) and their tokens (``EMBED_TOKENS``) are bounded, the
runner embeds a chunk at a time between decode steps within a share of the
loop (``runner.embedding``), and the server passes the runner's JSON of the
vectors through without decoding it.

Another user's stream is measured by its time per token: the gap between
two streamed chunks over the tokens the later one brings (each token has a
logprob entry). Its baseline is taken alone, in the same test."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from typing import Any

import pytest
from harness import MAX_RSS_GROWTH, MAX_SLOWDOWN, rss, runner_pids, slowdown, tiny_generate
from vectors import vectors_close

from jupyter_llm.request.limits import EMBED_INPUTS, EMBED_TOKENS

VICTIM_TOKENS = 1500  # a stream long enough for a hundred chunks


@pytest.fixture
def llm_config() -> dict:
    # tokens are grouped for 10 ms (0.1 s by default), so a stream of the fast
    # demo model comes in enough chunks to see its gaps
    return {"stream_interval": 0.01}


def victim_body() -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": "hello",
        "stream": True,
        "logprobs": True,
        "options": {"num_predict": VICTIM_TOKENS, "temperature": 0},
    }


async def token_gaps(client: Any) -> tuple[list[float], list[float], int]:
    """Stream the victim's generation from a thread of its own, timing each
    chunk as it arrives: the time per token of each chunk after the first,
    the gaps between chunks (the first: from the request to its first
    token), and the tokens counted."""

    def run() -> tuple[list[float], list[float], int]:
        arrivals: list[tuple[float, int]] = []
        buffer = b""
        sent = time.perf_counter()
        with client.http.stream("POST", client.base + "api/generate", json=victim_body()) as r:
            assert r.status_code == 200, r.read()
            for part in r.iter_raw():
                now = time.perf_counter()
                buffer += part
                *lines, buffer = buffer.split(b"\n")
                tokens = sum(len(json.loads(line).get("logprobs") or []) for line in lines if line)
                if tokens:
                    arrivals.append((now, tokens))
        per_token = [(b - a) / n for (a, _), (b, n) in itertools.pairwise(arrivals)]
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise([(sent, 0), *arrivals])]
        return per_token, gaps, sum(n for _, n in arrivals)

    return await asyncio.get_running_loop().run_in_executor(client.threads, run)


def embed_body(inputs: list[str], **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": inputs, **extra}


async def embedding_started(serverapp: Any) -> None:
    """Returns once the loaded runner says it is busy (with the embedding)."""
    scheduler = serverapp.web_app.settings["jupyter_llm"].scheduler
    while True:
        loaded = scheduler.loaded_models()
        if loaded and (await loaded[0].runner.process.call("health")).get("busy") is not None:
            return
        await asyncio.sleep(0.005)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def describe(name: str, per_token: list[float], gaps: list[float]) -> str:
    return (
        f"{name}: {statistics.median(per_token) * 1e3:.3f} ms/token (median of "
        f"{len(per_token)} chunks), first token after {gaps[0] * 1e3:.1f} ms, chunk gaps "
        f"median {statistics.median(gaps) * 1e3:.1f} p90 {quantile(gaps, 0.9) * 1e3:.1f} "
        f"max {max(gaps) * 1e3:.1f} ms"
    )


async def stream_beside(users: Any, serverapp: Any, attack: dict[str, Any]) -> dict[str, Any]:
    """The victim's stream alone, then while the embed request ``attack``
    runs (the stream starts once the runner is busy with it and must end
    before it does), then alone again: a busy machine's drift lands in the
    baseline too. Times per token and gaps alone and during, the attack's
    answer, and how much the runner grew."""
    attacker, victim = users
    status, warm = await attacker.json("api/embed", embed_body(["warm"]))  # both contexts
    assert status == 200, warm
    await token_gaps(victim)
    alone, alone_gaps, _ = await token_gaps(victim)
    (pid,) = runner_pids(serverapp)
    before = rss(pid)
    task = asyncio.ensure_future(attacker.json("api/embed", attack))
    await asyncio.wait_for(embedding_started(serverapp), 60)
    during, during_gaps, tokens = await token_gaps(victim)
    assert not task.done(), "the embedding ended before the stream: nothing was measured"
    status, answer = await task
    grown = rss(pid) - before
    after, after_gaps, _ = await token_gaps(victim)
    alone, alone_gaps = alone + after, alone_gaps + after_gaps
    report = describe("alone", alone, alone_gaps) + "; " + describe("during", during, during_gaps)
    print(report)
    return {
        "alone": alone,
        "alone_gaps": alone_gaps,
        "during": during,
        "during_gaps": during_gaps,
        "tokens": tokens,
        "status": status,
        "answer": answer,
        "grown": grown,
        "report": report,
    }


# -- the bounds -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("api/embed", embed_body(["x"] * (EMBED_INPUTS.value + 1))),
        ("v1/embeddings", embed_body(["x"] * (EMBED_INPUTS.value + 1))),
        ("api/embeddings", {"model": "tiny", "prompt": ["x"] * (EMBED_INPUTS.value + 1)}),
    ],
    ids=["ollama", "openai", "legacy"],
)
async def test_more_inputs_than_the_bound_is_a_400_naming_it(users, installed_model, path, body):
    attacker, _ = users
    status, answer = await attacker.json(path, body)
    assert status == 400, answer
    assert "embed_inputs" in json.dumps(answer) and "2,049" in json.dumps(answer), answer


@pytest.mark.parametrize("path", ["api/embed", "v1/embeddings"])
async def test_more_tokens_than_the_bound_is_a_400_naming_it(
    users, installed_model, jp_serverapp, path
):
    """150 inputs the demo model cuts to its 2048-token context: 307,200
    tokens, refused once the tokens counted pass 300,000."""
    attacker, _ = users
    text = "ab " * 800  # 2400 tokens, truncated to 2048
    status, answer = await attacker.json(path, embed_body([text] * 150))
    assert status == 400, answer
    message = json.dumps(answer)
    assert "embed_tokens" in message and f"{EMBED_TOKENS.value:,}" in message, answer
    status, answer = await attacker.json(path, embed_body([text] * 2))  # the runner is fine
    assert status == 200, answer
    assert len(runner_pids(jp_serverapp)) == 1


async def test_at_the_input_bound_the_vectors_come_back_in_order(users, installed_model):
    attacker, _ = users
    texts = [f"text number {i}" for i in range(EMBED_INPUTS.value)]
    status, answer = await attacker.json("api/embed", embed_body(texts))
    assert status == 200, answer
    assert len(answer["embeddings"]) == EMBED_INPUTS.value
    for i in (0, 1000, EMBED_INPUTS.value - 1):
        status, alone = await attacker.json("api/embed", embed_body([texts[i]]))
        assert vectors_close(alone["embeddings"][0], answer["embeddings"][i])
    status, legacy = await attacker.json("api/embeddings", {"model": "tiny", "prompt": texts[7]})
    assert status == 200 and len(legacy["embedding"]) == 64, legacy
    status, openai = await attacker.json("v1/embeddings", embed_body(texts[:3], dimensions=5))
    assert status == 200 and [d["index"] for d in openai["data"]] == [0, 1, 2], openai
    assert {len(d["embedding"]) for d in openai["data"]} == {5}


# -- fairness -------------------------------------------------------------------------
@pytest.mark.alone  # a ratio of times: not beside another worker's tests
async def test_the_original_attack_leaves_another_stream_within_2x(
    users, installed_model, jp_serverapp
):
    """300 inputs of about 200 tokens each, one dimension: each input alone
    is hundreds of the demo model's decode steps; it is cut into chunks."""
    measured = await stream_beside(
        users, jp_serverapp, embed_body(["hello world " * 18] * 300, dimensions=1)
    )
    assert measured["status"] == 200, measured["answer"]
    assert {len(v) for v in measured["answer"]["embeddings"]} == {1}
    ratio = statistics.median(measured["during"]) / statistics.median(measured["alone"])
    assert ratio <= MAX_SLOWDOWN, measured["report"]
    # no wait longer than a chunk: the slowest gaps grow no more than the typical ones
    tail = quantile(measured["during_gaps"], 0.9) / quantile(measured["alone_gaps"], 0.9)
    assert tail <= MAX_SLOWDOWN, measured["report"]
    assert measured["grown"] < MAX_RSS_GROWTH, measured["grown"]


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
async def test_beside_the_original_attack_another_answer_waits_at_most_a_chunk(
    users, installed_model, jp_serverapp
):
    """Another user's 10-token answer, each one arriving while the embedding
    runs: it waits for the chunk in progress, not for the embedding (before:
    for all 300 inputs, 0.8-1.2 s here)."""
    attacker, victim = users
    status, warm = await attacker.json("api/embed", embed_body(["warm"]))
    assert status == 200, warm

    async def attack(running: asyncio.Event) -> tuple[int, Any]:
        body = embed_body(["hello world " * 18] * 300, dimensions=1)
        task = asyncio.ensure_future(attacker.json("api/embed", body))
        await embedding_started(jp_serverapp)
        running.set()
        return await task

    measured, (status, answer) = await slowdown(
        lambda: victim.json("api/generate", tiny_generate()), attack
    )
    print(measured)
    assert status == 200, answer
    assert measured.ratio <= MAX_SLOWDOWN, measured


@pytest.mark.alone  # a ratio of times: not beside another worker's tests
async def test_an_embedding_at_the_input_bound_leaves_another_stream_within_2x(
    users, installed_model, jp_serverapp
):
    texts = [f"input {i}: some words" for i in range(EMBED_INPUTS.value)]  # 20 tokens each
    measured = await stream_beside(users, jp_serverapp, embed_body(texts))
    assert measured["status"] == 200, measured["answer"]
    assert len(measured["answer"]["embeddings"]) == EMBED_INPUTS.value
    assert measured["tokens"] >= VICTIM_TOKENS // 2, measured["tokens"]
    ratio = statistics.median(measured["during"]) / statistics.median(measured["alone"])
    assert ratio <= MAX_SLOWDOWN, measured["report"]
    assert measured["grown"] < MAX_RSS_GROWTH, measured["grown"]


async def test_tags_answer_while_the_largest_embedding_reply_is_delivered(
    users, installed_model, jp_serverapp
):
    """2048 vectors of the model's full size: the server never decodes them."""
    attacker, victim = users
    status, warm = await attacker.json("api/embed", embed_body(["warm"]))
    assert status == 200, warm
    texts = [f"text number {i}" for i in range(EMBED_INPUTS.value)]

    async def attack(running: asyncio.Event) -> tuple[int, Any]:
        task = asyncio.ensure_future(attacker.json("api/embed", embed_body(texts)))
        await embedding_started(jp_serverapp)
        running.set()
        return await task

    measured, (status, answer) = await slowdown(lambda: victim.json("api/tags"), attack)
    assert status == 200, answer
    assert len(answer["embeddings"]) == EMBED_INPUTS.value
    assert {len(v) for v in answer["embeddings"]} == {64}
    assert measured.ratio <= MAX_SLOWDOWN, measured
