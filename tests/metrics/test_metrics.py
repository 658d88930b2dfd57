"""Prometheus metrics in jupyter_server's own /metrics, scraped over HTTP with
the server's token and read by prometheus_client's text parser: real
requests to real runners on the demo model, each counted once by route,
model, user and outcome; token sums equal to the replies' counts; one
time-to-first-token observation per completion that generated a token; the
scheduler's state (slots, memory per device and kind) as /api/ps shows it."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_llm.metrics.labels import OTHER, LabelCap

Samples = dict[tuple[str, frozenset], float]
PROMPT = "Once upon a time, in a land far away, there lived"


async def scrape(jp_fetch) -> Samples:
    r = await jp_fetch("metrics")
    assert r.code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(r.body.decode()):
        for s in family.samples:
            if s.name.startswith("jupyter_llm_"):
                samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


async def generate(jp_fetch, body: dict) -> dict:
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def test_requests_tokens_and_state_as_scraped(jp_fetch, openai_client, installed_model):
    before = await scrape(jp_fetch)
    options = {"num_predict": 5, "temperature": 0, "seed": 1}
    first = await generate(jp_fetch, {"model": "tiny", "prompt": PROMPT, "stream": False,
                                      "options": options, "raw": True})  # fmt: skip
    again = await generate(jp_fetch, {"model": "tiny", "prompt": PROMPT, "stream": False,
                                      "options": options, "raw": True})  # fmt: skip
    chat = await openai_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    one = await openai_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1, temperature=0
    )
    embedded = json.loads(
        (
            await jp_fetch(
                "llm", "api", "embed", method="POST",
                body=json.dumps({"model": "tiny", "input": ["a b c", "d e"]}),
            )
        ).body
    )  # fmt: skip
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hey"}], "options": options}
    r = await jp_fetch("llm", "api", "chat", method="POST", body=json.dumps(body))
    streamed = [json.loads(line) for line in r.body.decode().splitlines() if line.strip()][-1]
    with pytest.raises(HTTPClientError) as missing:
        await generate(jp_fetch, {"model": "nothing-here", "prompt": "x", "stream": False})
    assert missing.value.code == 404
    after = await scrape(jp_fetch)

    req = "jupyter_llm_requests_total"
    model = {"model": installed_model, "user": "local"}
    assert delta(after, before, req, route="api/generate", outcome="ok", **model) == 2
    assert delta(after, before, req, route="v1/chat/completions", outcome="ok", **model) == 2
    assert delta(after, before, req, route="api/embed", outcome="ok", **model) == 1
    assert delta(after, before, req, route="api/chat", outcome="ok", **model) == 1  # streamed
    # a name no model has is never a label
    assert delta(after, before, req, route="api/generate", model="unknown", outcome="404") == 1
    assert delta(after, before, req) == 7

    prompt = first["prompt_eval_count"] + again["prompt_eval_count"]
    prompt += chat.usage.prompt_tokens + one.usage.prompt_tokens
    prompt += embedded["prompt_eval_count"] + streamed["prompt_eval_count"]
    assert delta(after, before, "jupyter_llm_prompt_tokens_total", **model) == prompt
    generated = first["eval_count"] + again["eval_count"]
    generated += chat.usage.completion_tokens + one.usage.completion_tokens
    generated += streamed["eval_count"]
    assert delta(after, before, "jupyter_llm_generated_tokens_total", **model) == generated
    # the repeated prompt reused its slot's cache: all but the token that starts the answer
    cached = delta(after, before, "jupyter_llm_prompt_cache_tokens_total", **model)
    assert cached >= again["prompt_eval_count"] - 1 > 0

    counts = [first["eval_count"], again["eval_count"]]
    counts += [chat.usage.completion_tokens, one.usage.completion_tokens, streamed["eval_count"]]
    ttft = "jupyter_llm_time_to_first_token_seconds_count"
    itl = "jupyter_llm_inter_token_latency_seconds_count"
    assert delta(after, before, ttft, model=installed_model) == sum(c > 0 for c in counts)
    assert delta(after, before, itl, model=installed_model) == sum(c > 1 for c in counts)
    assert delta(after, before, "jupyter_llm_model_loads_total", model=installed_model) == 1

    # the gauges are the scheduler's state now: loaded, idle, memory as /api/ps says
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    assert [m["name"] for m in ps] == [installed_model]
    on = {"model": installed_model}
    assert total(after, "jupyter_llm_busy_slots", **on) == 0
    assert total(after, "jupyter_llm_queue_depth", **on) == 0
    assert total(after, "jupyter_llm_slots", **on) >= 1
    assert total(after, "jupyter_llm_pending_requests") == 0
    assert total(after, "jupyter_llm_model_memory_bytes", **on) == ps[0]["size"] > 0
    assert total(after, "jupyter_llm_cpu_threads", **on) == ps[0]["threads"]["now"] >= 1
    for a in ps[0]["allocations"]:
        for kind in ("weights", "kv_cache", "graph"):
            name = "jupyter_llm_model_memory_bytes"
            got = total(after, name, device=a["device"], kind=kind, **on)
            assert got == a[kind]


async def test_a_scrape_without_the_token_is_refused(
    jp_serverapp, jp_base_url, http_server, http_server_port
):
    """jupyter_server's default (``authenticate_prometheus``): 403; the token
    as a bearer (the README's scrape config) is let in."""
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}metrics"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(HTTPClientError) as refused:
            await AsyncHTTPClient().fetch(url, headers=headers)
        assert refused.value.code == 403
    bearer = {"Authorization": f"Bearer {jp_serverapp.identity_provider.token}"}
    r = await AsyncHTTPClient().fetch(url, headers=bearer)
    assert "jupyter_llm_pending_requests" in r.body.decode()


def test_label_sets_past_the_cap_are_counted_as_other():
    """Past the cap, a new model or user goes to ``other``; the route and
    outcome (bounded by the code) stay; sets seen before keep their own."""
    cap = LabelCap(cap=3)
    counter = Counter("c", "c", ["route", "model", "user"], registry=CollectorRegistry())
    asked = [("api/chat", f"m{i}", f"u{i}") for i in range(5)] + [("api/chat", "m0", "u0")]
    for values in asked:
        counter.labels(*cap.bound(values, open_at=(1, 2))).inc()
    seen = {tuple(s.labels.values()): s.value for s in counter.collect()[0].samples
            if s.name == "c_total"}  # fmt: skip
    assert seen == {
        ("api/chat", "m0", "u0"): 2,
        ("api/chat", "m1", "u1"): 1,
        ("api/chat", OTHER, OTHER): 3,
    }


async def test_a_client_that_leaves_is_counted_as_cancelled(
    jp_serverapp, jp_base_url, http_server, http_server_port, endless_model
):
    """Counted once, when the generation stops, as ``cancelled``."""
    import httpx
    from endless import FOREVER
    from prometheus_client import REGISTRY
    from waiting import until

    labels = {"route": "api/generate", "model": f"{endless_model}:latest", "user": "local"}

    def count(outcome: str) -> float:
        name = "jupyter_llm_requests_total"
        return REGISTRY.get_sample_value(name, {**labels, "outcome": outcome}) or 0.0

    before = {o: count(o) for o in ("ok", "cancelled")}
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/generate"
    token = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}
    body = {"model": endless_model, "prompt": PROMPT, "options": {"num_predict": FOREVER}}
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", url, headers=token, json=body) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    break  # the first piece: leave
    await until(lambda: count("cancelled") == before["cancelled"] + 1, 30, "the cancel counted")
    assert count("ok") == before["ok"]
