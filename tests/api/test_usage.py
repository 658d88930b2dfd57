"""``GET /api/usage`` on a server whose users are a Hub's (an identity
provider that hands out Hub user models, read by ``request.identity`` as
behind JupyterHub), with a real runner: requests are counted per user,
kernel, cell and model from the origin headers; a user reads only their own
rows, an admin everyone's; bad headers and arguments are 400s in each API's
error shape."""

from __future__ import annotations

import json

import pytest
from hub_users import with_hub_users
from tornado.httpclient import HTTPClientError

KERNEL = "3f1c2a9e-8b7d-4c6e-9a1b-2d3e4f5a6b7c"


@pytest.fixture
def jp_server_config(jp_server_config):
    return with_hub_users(jp_server_config)


def auth(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"token {token}", **more}


async def generate(jp_fetch, token, headers=None, path=("api", "generate")):
    body = {"model": "tiny", "prompt": "hi", "stream": False, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"num_predict": 5, "temperature": 0}}  # fmt: skip
    if path[0] == "api":
        body.pop("messages")
    r = await jp_fetch("llm", *path, method="POST", body=json.dumps(body),
                       headers=auth(token, **(headers or {})))  # fmt: skip
    return json.loads(r.body)


async def usage(jp_fetch, token, **params):
    r = await jp_fetch("llm", "api", "usage", params=params, headers=auth(token))
    return json.loads(r.body)


CELL = {"X-LLM-Kernel": KERNEL, "X-LLM-Cell": "cell-1", "X-LLM-Execution-Count": "3"}


async def test_rows_per_user_kernel_and_cell(jp_fetch, installed_model):
    done = await generate(jp_fetch, "alice-token", CELL)
    await generate(jp_fetch, "alice-token", CELL)
    await generate(jp_fetch, "bob-token")  # no headers: "api"

    mine = await usage(jp_fetch, "alice-token", kernel=KERNEL)
    assert mine["user"] == "alice" and mine["admin"] is False
    assert [r["user"] for r in mine["users"]] == ["alice"]  # never bob's
    [cell] = mine["cells"]
    assert (cell["kernel"], cell["cell"], cell["execution_count"]) == (KERNEL, "cell-1", 3)
    assert cell["model"] == "tiny:latest" and cell["requests"] == 2
    assert cell["generated_tokens"] == 2 * done["eval_count"]
    assert cell["prompt_tokens"] == 2 * done["prompt_eval_count"]
    assert cell["tokens_per_second"] > 0 and cell["time_to_first_token"] > 0
    assert cell["device_seconds"] > 0 and cell["decode_seconds"] > 0
    assert all(r["user"] == "alice" for r in (await usage(jp_fetch, "alice-token"))["cells"])

    everyone = await usage(jp_fetch, "root-token")
    assert everyone["admin"] is True
    assert sorted(r["user"] for r in everyone["users"]) == ["alice", "bob"]
    assert {(r["user"], r["kernel"]) for r in everyone["cells"]} == {
        ("alice", KERNEL), ("bob", "api")
    }  # fmt: skip
    bobs = await usage(jp_fetch, "root-token", user="bob")
    assert [r["user"] for r in bobs["users"]] == ["bob"] and bobs["users"][0]["requests"] == 1


async def test_a_user_cannot_read_another_users_rows(jp_fetch):
    with pytest.raises(HTTPClientError) as e:
        await usage(jp_fetch, "alice-token", user="bob")
    assert e.value.code == 403
    assert json.loads(e.value.response.body) == {
        "error": "only an admin may read another user's usage"
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kernel": "k" * 65}, "kernel has 65 characters; the limit is 64 characters"),
        ({"user": "a/b"}, "user may hold only letters, digits"),
    ],
)
async def test_bad_arguments_are_a_400(jp_fetch, params, message):
    with pytest.raises(HTTPClientError) as e:
        await usage(jp_fetch, "root-token", **params)
    assert e.value.code == 400
    assert message in json.loads(e.value.response.body)["error"]


@pytest.mark.parametrize(
    ("path", "shape"),
    [(("api", "generate"), str), (("v1", "chat", "completions"), dict)],
)
async def test_a_bad_origin_header_is_a_400_in_the_apis_shape(jp_fetch, path, shape):
    with pytest.raises(HTTPClientError) as e:
        await generate(jp_fetch, "alice-token", {"X-LLM-Kernel": "x" * 500}, path)
    assert e.value.code == 400
    error = json.loads(e.value.response.body)["error"]
    assert isinstance(error, shape)
    text = error if shape is str else error["message"]
    assert "X-LLM-Kernel has 500 characters" in text and "x" * 100 not in text
