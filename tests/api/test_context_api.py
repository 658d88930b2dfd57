"""Context that never runs out, through the Ollama API: shift, truncation,
and the request fields that turn them off (``shift``, ``truncate``)."""

import json

import pytest
from tornado.httpclient import HTTPClientError

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
SMALL = 256  # llama.cpp's smallest context (it pads num_ctx up to this)


async def generate(jp_fetch, **body):
    r = await jp_fetch(
        "llm",
        "api",
        "generate",
        method="POST",
        body=json.dumps({"stream": False, **body}),
        request_timeout=300,  # a deadline, not a measurement
    )
    return json.loads(r.body)


async def test_one_generation_runs_past_num_ctx(jp_fetch, installed_model):
    past = SMALL + 20
    options = {**GREEDY, "num_ctx": SMALL, "num_predict": past}
    done = await generate(jp_fetch, model=installed_model, prompt="hello", options=options)
    assert (done["done_reason"], done["eval_count"]) == ("length", past)


async def test_shift_false_stops_at_the_end_of_the_context(jp_fetch, installed_model):
    options = {**GREEDY, "num_ctx": SMALL, "num_predict": SMALL + 20}
    done = await generate(
        jp_fetch, model=installed_model, prompt="hello", options=options, shift=False
    )
    assert done["done_reason"] == "length" and done["eval_count"] < SMALL


async def test_a_prompt_over_num_ctx_is_cut_or_refused(jp_fetch, installed_model):
    prompt = "lorem ipsum " * 400
    options = {**GREEDY, "num_ctx": SMALL, "num_predict": 2}
    done = await generate(jp_fetch, model=installed_model, prompt=prompt, options=options)
    assert done["eval_count"] == 2 and done["prompt_eval_count"] < SMALL
    with pytest.raises(HTTPClientError) as info:
        await generate(
            jp_fetch, model=installed_model, prompt=prompt, options=options, truncate=False
        )
    assert info.value.code == 400
    assert "does not fit the context length" in json.loads(info.value.response.body)["error"]


@pytest.mark.parametrize("field", ["truncate", "shift"])
async def test_the_fields_are_booleans(jp_fetch, installed_model, field):
    with pytest.raises(HTTPClientError) as info:
        await generate(jp_fetch, model=installed_model, prompt="x", **{field: "no"})
    assert info.value.code == 400
    assert f"{field} must be a boolean" in json.loads(info.value.response.body)["error"]
