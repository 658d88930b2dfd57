"""/api/pull from each source, against loopback servers speaking its protocol."""

from __future__ import annotations

import json

import httpx
import pytest
from loopback import DEADLINE, Pause, etag, pull_events, sha
from raw_http import open_post
from tornado.httpclient import HTTPClientError
from waiting import until

from jupyter_llm.models.download import (
    Interrupted,
    RetryNote,
    RetryPolicy,
    is_retryable,
    retry_status,
)
from jupyter_llm.models.pull import pick_gguf, retry_line, url_model_name, validate_manifest
from jupyter_llm.models.store import MEDIA_PARAMS, MEDIA_SYSTEM
from jupyter_llm.request.errors import PullFailed


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
    for insecure in ({}, {"insecure": None}):  # null is the default, as Ollama decodes it
        events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", **insecure})
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


FAST = RetryPolicy(attempts=5, base_delay=0.001)  # retries without waiting long


def model_layer(remote, ns="library/tiny/latest"):
    return json.loads(remote.manifests[ns])["layers"][0]


def blob_path(models_dir, digest, suffix=""):
    return models_dir / "blobs" / (digest.replace(":", "-") + suffix)


async def test_a_connection_dropped_twice_is_retried_with_range(
    jp_fetch, server, remote, demo_gguf, models_dir, puller
):
    data = demo_gguf.read_bytes()
    n = len(data)
    remote.add_model("library", "tiny", "latest", data)
    digest = model_layer(remote)["digest"]
    puller.retry = FAST
    remote.drops = [n // 4, n // 2]  # the first body stops at n/4, the resumed one at n/2
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert events[-1] == {"status": "success"}
    assert remote.ranges == [f"bytes={n // 4}-", f"bytes={n // 2}-"]
    assert sum(r == f"GET /cdn/{digest}" for r in remote.requests) == 3
    assert remote.if_ranges == [etag(data)] * 2  # each resume named the file it began
    retries = [e["status"] for e in events if e["status"].startswith("retrying")]
    assert len(retries) == 2
    assert f"from byte {n // 4} (attempt 2 of 5)" in retries[0]
    assert f"from byte {n // 2} (attempt 3 of 5)" in retries[1]
    assert all("RemoteProtocolError" in line for line in retries)
    # the blob's progress: before and after the retries, never going back
    where = [i for i, e in enumerate(events) if e.get("digest") == digest]
    first_retry = next(i for i, e in enumerate(events) if e["status"].startswith("retrying"))
    assert where[0] < first_retry and where[-1] > first_retry
    completed = [events[i]["completed"] for i in where]
    assert completed == sorted(completed) and completed[-1] == n
    assert all(events[i]["total"] == n for i in where)
    # the blob verifies and nothing partial is left
    assert sha(blob_path(models_dir, digest).read_bytes()) == digest
    assert not list((models_dir / "blobs").glob("*-partial*"))
    assert await tags(jp_fetch) == [f"{server.host}/library/tiny:latest"]


async def test_a_connection_dropping_every_time_fails_then_a_pull_resumes(
    jp_fetch, server, remote, demo_gguf, models_dir, puller
):
    data = demo_gguf.read_bytes()
    step = len(data) // 8
    remote.add_model("library", "tiny", "latest", data)
    digest = model_layer(remote)["digest"]
    puller.retry = RetryPolicy(attempts=3, base_delay=0.001)
    remote.drop_each = step
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    error = events[-1]["error"]
    assert "download interrupted after 3 attempts" in error and "pull again to resume" in error
    assert f"{3 * step} of {len(data)} bytes are kept" in error
    assert sum(e["status"].startswith("retrying") for e in events[:-1]) == 2
    assert remote.ranges == [f"bytes={step}-", f"bytes={2 * step}-"]
    assert blob_path(models_dir, digest, "-partial").stat().st_size == 3 * step
    assert await tags(jp_fetch) == []  # no half-pulled model is listed

    remote.drop_each = None
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert events[-1] == {"status": "success"}
    assert remote.ranges[-1] == f"bytes={3 * step}-"
    assert sha(blob_path(models_dir, digest).read_bytes()) == digest
    assert (await generate(jp_fetch, f"{server.host}/library/tiny:latest"))["eval_count"] == 2


@pytest.mark.parametrize(
    ("statuses", "outcome", "gets"),
    [
        ([503], "success", 2),
        ([500, 502, 504], "success", 4),
        ([404], "HTTP 404", 1),  # a refusal is final: no retry
        ([403], "HTTP 403", 1),
        ([429], "HTTP 429", 1),
    ],
)
async def test_server_errors_are_retried_refusals_are_not(
    jp_fetch, server, remote, demo_gguf, puller, statuses, outcome, gets
):
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    digest = model_layer(remote)["digest"]
    puller.retry = FAST
    remote.statuses = list(statuses)
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    if outcome == "success":
        assert events[-1] == {"status": "success"}
        lines = [e["status"] for e in events if e["status"].startswith("retrying")]
        assert [line.rsplit(": ", 1)[1] for line in lines] == [f"HTTP {s}" for s in statuses]
    else:
        assert outcome in events[-1]["error"]
        assert not any(e.get("status", "").startswith("retrying") for e in events)
    assert sum(r == f"GET /cdn/{digest}" for r in remote.requests) == gets


async def test_a_client_leaving_during_the_backoff_cancels_the_pull(
    jp_fetch,
    jp_serverapp,
    jp_base_url,
    http_server_port,
    server,
    remote,
    demo_gguf,
    models_dir,
    puller,
):
    import asyncio

    data = demo_gguf.read_bytes()
    n = len(data)
    remote.add_model("library", "tiny", "latest", data)
    digest = model_layer(remote)["digest"]
    puller.retry = RetryPolicy(base_delay=3600, max_delay=3600)  # far past any deadline
    remote.drops = [n // 3]
    body = {"model": f"{server.host}/library/tiny", "insecure": True}
    reader, writer = await open_pull(jp_serverapp, jp_base_url, http_server_port, body)
    await asyncio.wait_for(reader.readuntil(b"retrying"), DEADLINE)  # in the backoff now
    assert puller.in_progress() == {digest: 1}
    writer.close()
    await until(lambda: not puller.in_progress())  # an hour's backoff would outlast this
    assert sum(r == f"GET /cdn/{digest}" for r in remote.requests) == 1  # no retry ran
    assert blob_path(models_dir, digest, "-partial").stat().st_size == n // 3
    # a later pull starts afresh (it did not join a download left waiting) and resumes
    puller.retry = FAST
    events = await pull(jp_fetch, body)
    assert events[-1] == {"status": "success"}
    assert remote.ranges == [f"bytes={n // 3}-"]
    assert sha(blob_path(models_dir, digest).read_bytes()) == digest


async def open_pull(jp_serverapp, jp_base_url, http_server_port, body):
    """A streaming pull on a raw connection the test can close: (reader, writer)."""
    token = jp_serverapp.identity_provider.token
    return await open_post(http_server_port[1], jp_base_url, token, "api/pull", body)


async def test_a_shared_download_outlives_the_pull_that_began_it(
    jp_fetch,
    jp_serverapp,
    jp_base_url,
    http_server_port,
    server,
    remote,
    demo_gguf,
    models_dir,
    puller,
):
    """The first pull's client leaves while a second pull follows the download:
    it goes on, is retried after a drop, and the second pull gets the model."""
    import asyncio

    data = demo_gguf.read_bytes()
    remote.add_model("library", "tiny", "latest", data)
    digest = model_layer(remote)["digest"]
    puller.retry = FAST
    pause = remote.pauses[f"/cdn/{digest}"] = Pause(at=len(data) // 5, drop=True)
    body = {"model": f"{server.host}/library/tiny", "insecure": True}
    __, first = await open_pull(jp_serverapp, jp_base_url, http_server_port, body)
    second = None
    try:
        assert await asyncio.to_thread(pause.reached.wait, DEADLINE)
        second = asyncio.ensure_future(pull(jp_fetch, body))
        await until(lambda: puller.in_progress() == {digest: 2})
        first.close()
        await until(lambda: puller.running == 1)  # the first pull ended, client closed
        assert puller.in_progress() == {digest: 1}
    finally:
        pause.go.set()
    assert second is not None
    events = await asyncio.wait_for(second, DEADLINE)
    assert events[-1] == {"status": "success"}
    assert remote.ranges == [f"bytes={len(data) // 5}-"]
    assert sum(e["status"].startswith("retrying") for e in events) == 1
    assert sha(blob_path(models_dir, digest).read_bytes()) == digest


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


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        (RetryPolicy(), [1, 2, 4, 8]),
        (RetryPolicy(attempts=8, base_delay=0.5, max_delay=10), [0.5, 1, 2, 4, 8, 10, 10]),
        (RetryPolicy(base_delay=0), [0, 0, 0, 0]),
    ],
)
def test_retry_backoff_doubles_up_to_its_cap(policy, delays):
    assert [policy.delay(k) for k in range(1, policy.attempts)] == delays


@pytest.mark.parametrize(
    "policy", [{"attempts": 0}, {"base_delay": -1}, {"max_delay": -1}], ids=str
)
def test_bad_retry_policies_are_refused(policy):
    with pytest.raises(ValueError, match="invalid retry policy"):
        RetryPolicy(**policy)


def httpx_error(name):
    return getattr(httpx, name)("boom", request=httpx.Request("GET", "http://127.0.0.1/"))


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (httpx_error("ConnectError"), True),
        (httpx_error("ReadTimeout"), True),
        (httpx_error("ConnectTimeout"), True),
        (httpx_error("ReadError"), True),
        (httpx_error("RemoteProtocolError"), True),  # a body cut short
        (Interrupted("the body ended after 5 of 9 bytes"), True),
        (httpx_error("UnsupportedProtocol"), False),
        (httpx_error("LocalProtocolError"), False),
        (httpx_error("TooManyRedirects"), False),
        (PullFailed("digest mismatch"), False),
        (OSError(28, "No space left on device"), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_which_errors_are_retried(error, retry):
    assert is_retryable(error) is retry


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        *[(status, True) for status in (500, 502, 503, 504, 599)],
        *[(status, False) for status in (400, 401, 403, 404, 416, 429)],
    ],
)
def test_which_statuses_are_retried(status, retry):
    assert retry_status(status) is retry


def test_retry_line():
    note = RetryNote(attempt=2, attempts=5, delay=0.25, reason="HTTP 503", offset=1024)
    assert retry_line("abcdef012345", note) == (
        "retrying abcdef012345 in 0.25s from byte 1024 (attempt 2 of 5): HTTP 503"
    )
