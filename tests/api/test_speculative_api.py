"""Speculative decoding as clients see it (issue 26 item 2): the final
chunk's draft counters, /api/ps's per-model totals, the Prometheus counters
and the %%llm footer, on a real runner with the demo model. The answer is the
same with and without drafts."""

from __future__ import annotations

import json

from jupyter_llm.kernel.results import Metrics
from tests.metrics.test_metrics import delta, scrape

PROMPT = "hello world hello world hello world hello"


async def generate(jp_fetch, **options) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 60, **options}}  # fmt: skip
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def test_the_final_chunk_ps_and_metrics_report_drafts(jp_fetch, installed_model):
    plain = await generate(jp_fetch, draft_num_predict=0)
    assert "draft_tokens" not in plain  # nothing drafted: Ollama's fields only
    before = await scrape(jp_fetch)
    spec = await generate(jp_fetch)  # the default: 4
    after = await scrape(jp_fetch)
    assert spec["response"] == plain["response"] and spec["context"] == plain["context"]
    assert 0 < spec["draft_accepted"] <= spec["draft_tokens"]
    drafted = delta(after, before, "jupyter_llm_draft_tokens_total", model=installed_model)
    accepted = delta(
        after, before, "jupyter_llm_draft_accepted_tokens_total", model=installed_model
    )
    assert (drafted, accepted) == (spec["draft_tokens"], spec["draft_accepted"])
    r = await jp_fetch("llm", "api", "ps")
    [model] = json.loads(r.body)["models"]
    totals = model["speculative"]
    assert totals["accepted"] >= spec["draft_accepted"] and totals["drafted"] >= drafted


async def test_the_streamed_final_chunk_reports_drafts(jp_fetch, installed_model):
    body = {"model": "tiny", "prompt": PROMPT, "raw": True,
            "options": {"temperature": 0, "num_predict": 60}}  # fmt: skip
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    chunks = [json.loads(line) for line in r.body.decode().splitlines() if line]
    assert chunks[-1]["done"] and chunks[-1]["draft_accepted"] > 0
    assert all("draft_tokens" not in c for c in chunks[:-1])


def test_the_footer_says_how_many_drafts_were_accepted():
    final = {"eval_count": 60, "eval_duration": 10**9, "draft_tokens": 48, "draft_accepted": 40}
    assert "40/48 drafts accepted" in Metrics.from_final("tiny", final).footer()
    assert "draft" not in Metrics.from_final("tiny", {"eval_count": 3}).footer()
