"""/api/pull from each source, against loopback servers speaking its protocol."""

from __future__ import annotations

import json

import pytest
from loopback import DEADLINE, Pause, pull_events, sha
from tornado.httpclient import HTTPClientError

from jupyter_llm.errors import PullFailed
from jupyter_llm.models.pull import pick_gguf, url_model_name, validate_manifest
from jupyter_llm.models.store import MEDIA_PARAMS, MEDIA_SYSTEM


async def pull(jp_fetch, body):
    return await pull_events(jp_fetch, body, timeout=120)


async def generate(jp_fetch, model):
    body = {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def tags(jp_fetch):
    return [m["name"] for m in json.loads((await jp_fetch("llm", "api", "tags")).body)["models"]]


async def test_registry_pull_with_token_auth_and_redirects(
    jp_fetch, server, remote, demo_gguf, models_dir
):
    remote.token = "secret"
    remote.add_model(
        "library",
        "tiny",
        "v1",
        demo_gguf.read_bytes(),
        extra=[("application/vnd.ollama.image.system", b"be brief")],
    )
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny:v1", "insecure": True})
    statuses = [e.get("status") for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "writing manifest" in statuses and "verifying sha256 digest" in statuses
    blob_events = [e for e in events if e.get("digest")]
    assert blob_events and all({"total", "completed"} <= set(e) for e in blob_events)
    assert blob_events[-1]["completed"] == blob_events[-1]["total"]
    assert await tags(jp_fetch) == [f"{server.host}/library/tiny:v1"]
    assert (await generate(jp_fetch, f"{server.host}/library/tiny:v1"))["eval_count"] == 2
    assert any(req.startswith("GET /cdn/") for req in remote.requests)  # followed redirects
    # pulling again downloads nothing
    before = len(remote.requests)
    await pull(jp_fetch, {"model": f"{server.host}/library/tiny:v1", "insecure": True})
    assert not any(r.startswith("GET /cdn/") for r in remote.requests[before:])


async def test_plain_http_needs_insecure(jp_fetch, server, remote, demo_gguf):
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny"})
    assert "error" in events[-1]  # https to a plain http server fails
    assert await tags(jp_fetch) == []


async def test_unknown_model_in_registry(jp_fetch, server):
    events = await pull(jp_fetch, {"model": f"{server.host}/library/nope", "insecure": True})
    assert "file does not exist" in events[-1]["error"]
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(
            "llm",
            "api",
            "pull",
            method="POST",
            body=json.dumps(
                {"model": f"{server.host}/library/nope", "insecure": True, "stream": False}
            ),
        )
    assert info.value.code == 404


async def test_wrong_digest_is_refused_and_nothing_listed(
    jp_fetch, server, remote, demo_gguf, models_dir
):
    manifest = remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    remote.corrupt.add(manifest["layers"][0]["digest"])
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert "digest mismatch" in events[-1]["error"]
    assert await tags(jp_fetch) == []
    blobs = models_dir / "blobs"
    assert not (blobs / manifest["layers"][0]["digest"].replace(":", "-")).exists()
    assert not list(blobs.glob("*-partial"))


async def test_dropped_connection_then_resume_with_range(
    jp_fetch, server, remote, demo_gguf, models_dir
):
    data = demo_gguf.read_bytes()
    manifest = remote.add_model("library", "tiny", "latest", data)
    remote.drop_after = len(data) // 3
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert "interrupted" in events[-1]["error"]
    assert await tags(jp_fetch) == []  # no half-pulled model is listed
    partial = (
        models_dir / "blobs" / (manifest["layers"][0]["digest"].replace(":", "-") + "-partial")
    )
    assert partial.stat().st_size == len(data) // 3

    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert events[-1] == {"status": "success"}
    assert f"bytes={len(data) // 3}-" in remote.ranges
    assert (await generate(jp_fetch, f"{server.host}/library/tiny:latest"))["eval_count"] == 2


async def test_manifest_digest_traversal_refused(jp_fetch, server, remote, demo_gguf, models_dir):
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    bad = json.loads(remote.manifests["library/tiny/latest"])
    bad["layers"][0]["digest"] = "sha256:../../../../etc/passwd"
    remote.manifests["library/evil/latest"] = json.dumps(bad).encode()
    events = await pull(jp_fetch, {"model": f"{server.host}/library/evil", "insecure": True})
    assert "invalid manifest digest" in events[-1]["error"]
    assert await tags(jp_fetch) == []


async def test_concurrent_pulls_share_one_download(jp_fetch, server, remote, demo_gguf):
    import asyncio

    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    name = f"{server.host}/library/tiny"
    a, b = await asyncio.gather(
        pull(jp_fetch, {"model": name, "insecure": True}),
        pull(jp_fetch, {"model": name, "insecure": True}),
    )
    assert a[-1] == b[-1] == {"status": "success"}
    model_digest = json.loads(remote.manifests["library/tiny/latest"])["layers"][0]["digest"]
    assert sum(r == f"GET /cdn/{model_digest}" for r in remote.requests) == 1


async def test_hugging_face_pull_picks_the_quant(jp_fetch, jp_serverapp, server, remote, demo_gguf):
    data = demo_gguf.read_bytes()
    remote.hf_repos["someone/Tiny-GGUF"] = {"tiny.Q8_0.gguf": data + b"", "tiny.Q4_K_M.gguf": data}
    jp_serverapp.web_app.settings["jupyter_llm"].puller.hf_endpoint = server.base
    events = await pull(jp_fetch, {"model": "hf.co/someone/Tiny-GGUF"})
    assert events[-1] == {"status": "success"}
    assert await tags(jp_fetch) == ["hf.co/someone/Tiny-GGUF:Q4_K_M"]
    show = await jp_fetch(
        "llm",
        "api",
        "show",
        method="POST",
        body=json.dumps({"model": "hf.co/someone/Tiny-GGUF:Q4_K_M"}),
    )
    assert "im_start" in json.loads(show.body)["template"]  # the GGUF's chat template
    assert (await generate(jp_fetch, "hf.co/someone/Tiny-GGUF:Q4_K_M"))["eval_count"] == 2
    events = await pull(jp_fetch, {"model": "hf.co/someone/Tiny-GGUF:IQ2_XS"})
    assert "no GGUF for quantization 'IQ2_XS'" in events[-1]["error"]
    assert "Q4_K_M" in events[-1]["error"] and "Q8_0" in events[-1]["error"]


async def test_direct_url_pull(jp_fetch, server, remote, demo_gguf):
    remote.files["/files/Tiny-Model.Q8_0.gguf"] = demo_gguf.read_bytes()
    events = await pull(jp_fetch, {"model": f"{server.base}/files/Tiny-Model.Q8_0.gguf"})
    assert events[-1] == {"status": "success"}
    assert await tags(jp_fetch) == ["tiny-model.q8_0:latest"]
    events = await pull(
        jp_fetch, {"model": f"{server.base}/files/Tiny-Model.Q8_0.gguf", "name": "mine"}
    )
    assert "mine:latest" in await tags(jp_fetch)
    events = await pull(jp_fetch, {"model": f"{server.base}/files/none.gguf"})
    assert "error" in events[-1]


@pytest.mark.parametrize(
    "body",
    [
        {"model": ""},
        {"model": 3},
        {"model": "../x"},
        {"model": "x", "insecure": "yes"},
        {"model": "https://example.invalid/file.bin"},
    ],
)
async def test_bad_pull_requests(jp_fetch, body):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "pull", method="POST", body=json.dumps(body))
    assert info.value.code == 400


def test_pick_gguf():
    siblings = [
        {"rfilename": "m.Q4_K_M.gguf", "lfs": {"sha256": "a" * 64, "size": 5}},
        {"rfilename": "m.q8_0.gguf"},
        {"rfilename": "mmproj-m.Q4_K_M.gguf"},
    ]
    assert pick_gguf(siblings, "Q4_K_M") == ("m.Q4_K_M.gguf", "sha256:" + "a" * 64, 5)
    assert pick_gguf(siblings, "Q8_0")[0] == "m.q8_0.gguf"
    with pytest.raises(PullFailed, match="available: Q4_K_M, Q8_0"):
        pick_gguf(siblings, "Q2_K")


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("Llama-3.2-1B.Q4_K_M.gguf", "llama-3.2-1b.q4_k_m:latest"),
        ("weird name!.gguf", "weird-name:latest"),
    ],
)
def test_url_model_name(file, name):
    assert url_model_name(file) == name


def test_validate_manifest_refuses_huge_text_layers():
    from jupyter_llm.models.store import MAX_TEXT_LAYER

    manifest = {
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": sha(b"x"), "size": 1},
            {"mediaType": MEDIA_SYSTEM, "digest": sha(b"s"), "size": MAX_TEXT_LAYER + 1},
        ],
        "config": {"digest": sha(b"c"), "size": 1},
    }
    with pytest.raises(PullFailed, match="too large"):
        validate_manifest(json.dumps(manifest).encode())
    manifest["layers"][1]["size"] = 1
    manifest["config"]["size"] = MAX_TEXT_LAYER + 1
    with pytest.raises(PullFailed, match="too large"):
        validate_manifest(json.dumps(manifest).encode())


def test_validate_manifest_refuses_bad_digests():
    good = {
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": sha(b"x"), "size": 1}
        ],
        "config": {"digest": sha(b"c"), "size": 1},
    }
    assert validate_manifest(json.dumps(good).encode())[0][0]["size"] == 1
    for digest in ("sha256:../../x", "md5:abc", "sha256:" + "A" * 64):
        bad = json.loads(json.dumps(good))
        bad["layers"][0]["digest"] = digest
        with pytest.raises(PullFailed):
            validate_manifest(json.dumps(bad).encode())


async def test_not_enough_disk_space_fails_before_downloading(
    jp_fetch, server, remote, demo_gguf, monkeypatch
):
    import shutil
    from collections import namedtuple

    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(
            "llm",
            "api",
            "pull",
            method="POST",
            body=json.dumps(
                {"model": f"{server.host}/library/tiny", "insecure": True, "stream": False}
            ),
        )
    assert info.value.code == 507
    assert "not enough disk space" in json.loads(info.value.response.body)["error"]
    assert not any(r.startswith("GET /cdn/") for r in remote.requests)


async def test_rm_during_a_pull_keeps_the_blobs_the_pull_reuses(
    jp_fetch, server, remote, demo_gguf, models_dir
):
    """A pull that found the GGUF already in the store must not lose it to an rm
    of the model that brought it, while the pull downloads its other layers."""
    import asyncio

    gguf = demo_gguf.read_bytes()
    remote.add_model("library", "base", "latest", gguf)
    system = b"a system prompt, downloaded slowly"
    variant = remote.add_model("library", "variant", "latest", gguf, extra=[(MEDIA_SYSTEM, system)])
    assert (await pull(jp_fetch, {"model": f"{server.host}/library/base", "insecure": True}))[
        -1
    ] == {"status": "success"}
    pause = remote.pauses[f"/cdn/{sha(system)}"] = Pause(at=5)
    task = asyncio.ensure_future(
        pull(jp_fetch, {"model": f"{server.host}/library/variant", "insecure": True})
    )
    try:
        assert await asyncio.to_thread(pause.reached.wait, DEADLINE)
        body = json.dumps({"model": f"{server.host}/library/base"})
        await jp_fetch(
            "llm", "api", "delete", method="DELETE", body=body, allow_nonstandard_methods=True
        )
        model_blob = models_dir / "blobs" / variant["layers"][0]["digest"].replace(":", "-")
        assert model_blob.exists()
    finally:
        pause.go.set()
    events = await asyncio.wait_for(task, DEADLINE)
    assert events[-1] == {"status": "success"}
    assert await tags(jp_fetch) == [f"{server.host}/library/variant:latest"]
    assert (await generate(jp_fetch, f"{server.host}/library/variant"))["eval_count"] == 2


async def test_pulled_parameters_are_checked_like_request_options(
    jp_fetch, server, remote, demo_gguf
):
    """A registry's params layer cannot ask for a 2^40-token context: bad values
    are dropped, the good ones apply."""
    params = json.dumps({"num_ctx": 1 << 40, "num_predict": 4, "temperature": "hot"}).encode()
    remote.add_model(
        "library", "tiny", "latest", demo_gguf.read_bytes(), extra=[(MEDIA_PARAMS, params)]
    )
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert events[-1] == {"status": "success"}
    body = {"model": f"{server.host}/library/tiny", "prompt": "hi", "stream": False}
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    assert json.loads(r.body)["eval_count"] == 4
