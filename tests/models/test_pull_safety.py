"""Pulls against hostile or changing servers: no download past its declared
size, no full disk kept for a resume, no unbounded manifest or API answer, no
resume spliced from two different files."""

from __future__ import annotations

import asyncio
import errno
import json

import pytest
from loopback import DEADLINE, Pause, Trick, etag, sha
from loopback import pull_events as pull
from tornado.httpclient import HTTPClientError

from jupyter_llm.models.download import RetryPolicy

BIG = 10 << 30  # a Content-Length no pull should believe


async def pull_status(jp_fetch, body):
    """HTTP status and error of a non-streaming pull."""
    with pytest.raises(HTTPClientError) as info:
        await asyncio.wait_for(
            jp_fetch(
                "llm",
                "api",
                "pull",
                method="POST",
                body=json.dumps({**body, "stream": False}),
                request_timeout=DEADLINE,
            ),
            DEADLINE,
        )
    return info.value.code, json.loads(info.value.response.body)["error"]


async def tags(jp_fetch):
    return [m["name"] for m in json.loads((await jp_fetch("llm", "api", "tags")).body)["models"]]


def leftovers(models_dir):
    blobs = models_dir / "blobs"
    return sorted(p.name for p in blobs.iterdir()) if blobs.is_dir() else []


@pytest.mark.parametrize(
    "trick",
    [
        Trick(extra=b"x" * (1 << 20), declared=BIG, hang=True),  # claims far more
        Trick(extra=b"x" * (1 << 20), chunked=True, hang=True),  # claims nothing, sends more
    ],
    ids=["content-length", "chunked"],
)
async def test_a_blob_stops_at_its_declared_size(
    jp_fetch, server, remote, demo_gguf, models_dir, trick
):
    manifest = remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    digest = manifest["layers"][0]["digest"]
    remote.tricks[f"/cdn/{digest}"] = trick
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert "more than the" in events[-1]["error"]
    assert await tags(jp_fetch) == []
    assert not [name for name in leftovers(models_dir) if digest[7:] in name]


async def test_a_full_disk_deletes_the_partial_and_answers_507(
    jp_fetch, server, remote, demo_gguf, models_dir, monkeypatch
):
    from jupyter_llm.models import download

    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    writes = []

    def full_disk(out, hasher, data):
        writes.append(len(data))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download, "write_chunk", full_disk)
    code, error = await pull_status(
        jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True}
    )
    assert writes and code == 507 and "disk" in error
    assert not [name for name in leftovers(models_dir) if "partial" in name]
    assert await tags(jp_fetch) == []


@pytest.mark.parametrize(
    "trick",
    [
        Trick(extra=b" " * (8 << 20), declared=BIG, hang=True),
        Trick(extra=b" " * (8 << 20), chunked=True, hang=True),
    ],
    ids=["content-length", "chunked"],
)
async def test_a_huge_manifest_is_refused_at_the_cap(jp_fetch, server, remote, demo_gguf, trick):
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    remote.tricks["/v2/library/tiny/manifests/latest"] = trick
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert "too large" in events[-1]["error"]
    assert not any(r.startswith("GET /cdn/") for r in remote.requests)


async def test_a_huge_hugging_face_answer_is_refused_at_the_cap(
    jp_fetch, jp_serverapp, server, remote, demo_gguf
):
    remote.hf_repos["someone/Tiny-GGUF"] = {"tiny.Q4_K_M.gguf": demo_gguf.read_bytes()}
    remote.tricks["/api/models/someone/Tiny-GGUF"] = Trick(
        extra=b" " * (20 << 20), chunked=True, hang=True
    )
    jp_serverapp.web_app.settings["jupyter_llm"].puller.hf_endpoint = server.base
    events = await pull(jp_fetch, {"model": "hf.co/someone/Tiny-GGUF"})
    assert "too large" in events[-1]["error"]


async def test_a_huge_token_answer_is_refused_at_the_cap(jp_fetch, server, remote, demo_gguf):
    remote.token = "secret"
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    remote.tricks["/token"] = Trick(extra=b" " * (8 << 20), chunked=True, hang=True)
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert "error" in events[-1]
    assert await tags(jp_fetch) == []


def changed(data: bytes) -> bytes:
    """Another valid GGUF of the same length that differs near the start."""
    other = data.replace(b"jupyter-llm-demo", b"jupyter-llm-DEMO", 1)
    assert other != data and len(other) == len(data)
    return other


async def interrupted_url_pull(jp_fetch, server, remote, data, models_dir, puller) -> str:
    """A URL pull of one attempt, cut off after a third of the file, leaving a partial."""
    path = "/files/Tiny.gguf"
    remote.files[path] = data
    remote.drop_after = len(data) // 3
    puller.retry = RetryPolicy(attempts=1)
    events = await pull(jp_fetch, {"model": f"{server.base}{path}"})
    assert "interrupted after 1 attempt (" in events[-1]["error"]
    assert any(name.endswith("-partial") for name in leftovers(models_dir))
    puller.retry = RetryPolicy(base_delay=0.001)
    return path


async def pulled_blob(jp_fetch, models_dir) -> bytes:
    show = await jp_fetch(
        "llm", "api", "show", method="POST", body=json.dumps({"model": "tiny:latest"})
    )
    modelfile = json.loads(show.body)["modelfile"]
    path = next(line for line in modelfile.splitlines() if line.startswith("FROM "))[5:]
    assert path.startswith(str(models_dir))
    with open(path, "rb") as f:
        return f.read()


async def test_a_resume_after_the_file_changed_starts_again(
    jp_fetch, server, remote, demo_gguf, models_dir, puller
):
    old = demo_gguf.read_bytes()
    path = await interrupted_url_pull(jp_fetch, server, remote, old, models_dir, puller)
    remote.files[path] = new = changed(old)  # the server honours If-Range: 200, whole file
    events = await pull(jp_fetch, {"model": f"{server.base}{path}"})
    assert events[-1] == {"status": "success"}
    assert remote.if_ranges == [etag(old)]  # the resume named the file it had begun
    assert sha(await pulled_blob(jp_fetch, models_dir)) == sha(new)
    assert not [name for name in leftovers(models_dir) if "partial" in name]


async def test_a_resume_from_a_server_ignoring_if_range_starts_again(
    jp_fetch, server, remote, demo_gguf, models_dir, puller
):
    old = demo_gguf.read_bytes()
    path = await interrupted_url_pull(jp_fetch, server, remote, old, models_dir, puller)
    remote.files[path] = new = changed(old)
    remote.if_range = False  # answers 206 of the new file, with the new file's ETag
    events = await pull(jp_fetch, {"model": f"{server.base}{path}"})
    assert events[-1] == {"status": "success"}
    assert sha(await pulled_blob(jp_fetch, models_dir)) == sha(new)


async def test_a_resume_answered_from_the_wrong_byte_starts_again(
    jp_fetch, server, remote, demo_gguf, models_dir, puller
):
    data = demo_gguf.read_bytes()
    path = await interrupted_url_pull(jp_fetch, server, remote, data, models_dir, puller)
    remote.wrong_range_start = True  # 206, but Content-Range starts at 0
    events = await pull(jp_fetch, {"model": f"{server.base}{path}"})
    assert events[-1] == {"status": "success"}
    assert sha(await pulled_blob(jp_fetch, models_dir)) == sha(data)


async def test_a_retry_after_the_file_changed_starts_again(
    jp_fetch, server, remote, demo_gguf, models_dir, puller
):
    """The file changes while its download is cut off: the retry names the file
    it began (If-Range), gets the new one whole, and the new one is kept."""
    import asyncio

    old = demo_gguf.read_bytes()
    path = "/files/Tiny.gguf"
    remote.files[path] = old
    puller.retry = RetryPolicy(base_delay=0.001)
    pause = remote.pauses[path] = Pause(at=len(old) // 3, drop=True)
    task = asyncio.ensure_future(pull(jp_fetch, {"model": f"{server.base}{path}"}))
    try:
        assert await asyncio.to_thread(pause.reached.wait, DEADLINE)
        remote.files[path] = new = changed(old)
    finally:
        pause.go.set()
    events = await asyncio.wait_for(task, DEADLINE)
    assert events[-1] == {"status": "success"}
    assert sum(e["status"].startswith("retrying") for e in events) == 1
    assert remote.if_ranges == [etag(old)] and remote.ranges == []  # answered whole
    assert sha(await pulled_blob(jp_fetch, models_dir)) == sha(new)
    assert not [name for name in leftovers(models_dir) if "partial" in name]
