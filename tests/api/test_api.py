"""Handlers through a real Jupyter server, real runners, the generated model."""

import hashlib
import json
import signal

import psutil
import pytest
from endless import FOREVER
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from vectors import vectors_close
from waiting import until

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


def lines(response):
    return [json.loads(x) for x in response.body.decode().splitlines() if x.strip()]


async def post(jp_fetch, path, body, raw=None):
    return await jp_fetch(
        "llm", *path.split("/"), method="POST", body=raw if raw is not None else json.dumps(body)
    )


async def expect_error(jp_fetch, path, body, status, match, raw=None, method="POST"):
    with pytest.raises(HTTPClientError) as info:
        if method == "POST":
            await post(jp_fetch, path, body, raw)
        else:
            await jp_fetch("llm", *path.split("/"), method=method)
    assert info.value.code == status
    message = json.loads(info.value.response.body)["error"]
    assert match in message, message
    return message


async def test_version_and_devices(jp_fetch):
    r = await jp_fetch("llm", "api", "version")
    assert json.loads(r.body)["version"]
    r = await jp_fetch("llm", "api", "devices")
    data = json.loads(r.body)
    cpu = [d for d in data["devices"] if d["library"] == "CPU"]
    assert cpu and cpu[0]["total_memory"] > 0
    assert set(cpu[0]) >= {
        "id",
        "library",
        "name",
        "description",
        "integrated",
        "pci_id",
        "total_memory",
        "free_memory",
        "compute",
        "driver",
    }
    assert set(data["system"]) >= {"total_memory", "free_memory", "free_swap", "threads"}


class TestSimulated:
    @pytest.fixture
    def simulated_devices(self):
        return [
            {
                "id": "GPU-igpu",
                "library": "Vulkan",
                "name": "Radeon 780M",
                "integrated": True,
                "total_memory": 32 << 30,
                "free_memory": 30 << 30,
            },
            {
                "id": "GPU-0",
                "library": "CUDA",
                "name": "RTX 4060",
                "total_memory": 8 << 30,
                "free_memory": 7 << 30,
            },
        ]

    async def test_devices_sorted(self, jp_fetch):
        data = json.loads((await jp_fetch("llm", "api", "devices")).body)
        assert [d["name"] for d in data["devices"]][:2] == ["RTX 4060", "Radeon 780M"]
        assert data["devices"][-1]["library"] == "CPU"
        assert data["simulated"] is True


async def test_blob_upload_and_create(jp_fetch, demo_gguf):
    data = demo_gguf.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "blobs", digest, method="HEAD")
    assert info.value.code == 404
    r = await jp_fetch("llm", "api", "blobs", digest, method="POST", body=data)
    assert r.code == 201
    r = await jp_fetch("llm", "api", "blobs", digest, method="HEAD")
    assert r.code == 200

    r = await post(jp_fetch, "api/create", {"model": "mine", "files": {"m.gguf": digest}})
    assert lines(r)[-1] == {"status": "success"}
    tags = json.loads((await jp_fetch("llm", "api", "tags")).body)["models"]
    assert [m["name"] for m in tags] == ["mine:latest"]
    assert tags[0]["details"]["family"] == "llama"
    assert tags[0]["size"] == len(data)


async def test_blob_with_wrong_digest_refused(jp_fetch, models_dir):
    wrong = "sha256:" + hashlib.sha256(b"other").hexdigest()
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "blobs", wrong, method="POST", body=b"payload")
    assert info.value.code == 400
    assert "digest mismatch" in json.loads(info.value.response.body)["error"]
    blobs = models_dir / "blobs"
    assert not blobs.exists() or list(blobs.iterdir()) == []


async def test_blob_bad_digest_syntax(jp_fetch):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "blobs", "sha256:..%2F..%2Fx", method="POST", body=b"x")
    assert info.value.code == 400


async def test_generate_streaming(jp_fetch, installed_model):
    r = await post(
        jp_fetch,
        "api/generate",
        {"model": "tiny", "prompt": "hello", "options": {**GREEDY, "num_predict": 8}},
    )
    assert r.headers["Content-Type"].startswith("application/x-ndjson")
    chunks = lines(r)
    final = chunks[-1]
    assert final["done"] is True and final["done_reason"] == "length"
    assert final["eval_count"] == 8
    for key in (
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_duration",
    ):
        assert isinstance(final[key], int) and final[key] > 0, key
    assert all(c["done"] is False and c["model"] == "tiny" for c in chunks[:-1])  # as written
    text = "".join(c["response"] for c in chunks)
    assert len(text) >= 8

    # same request, not streamed: same text (greedy), one object, warm model
    r = await post(
        jp_fetch,
        "api/generate",
        {
            "model": "tiny",
            "prompt": "hello",
            "stream": False,
            "options": {**GREEDY, "num_predict": 8},
        },
    )
    body = json.loads(r.body)
    assert body["response"] == text and body["done"]
    assert "load_duration" not in body  # warm: 0, left out as Ollama's omitempty leaves it


async def test_chat_streaming_and_not(jp_fetch, installed_model):
    req = {
        "model": "tiny",
        "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}],
        "options": {**GREEDY, "num_predict": 6, "seed": 1},
    }
    chunks = lines(await post(jp_fetch, "api/chat", req))
    assert chunks[-1]["done"] and chunks[-1]["message"]["role"] == "assistant"
    text = "".join(c["message"]["content"] for c in chunks)
    body = json.loads((await post(jp_fetch, "api/chat", {**req, "stream": False})).body)
    assert body["message"]["content"] == text
    assert body["prompt_eval_count"] > 10


async def test_empty_prompt_loads_and_unloads(jp_fetch, installed_model):
    r = await post(jp_fetch, "api/generate", {"model": "tiny"})
    assert json.loads(r.body)["done_reason"] == "load"
    ps = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    assert [m["name"] for m in ps] == ["tiny:latest"]
    r = await post(jp_fetch, "api/generate", {"model": "tiny", "keep_alive": 0})
    assert json.loads(r.body)["done_reason"] == "unload"
    assert json.loads((await jp_fetch("llm", "api", "ps")).body)["models"] == []


BAD_INPUTS = [
    ("api/generate", None, b"{not json", 400, "invalid JSON"),
    ("api/generate", None, b"[1, 2]", 400, "JSON object"),
    ("api/generate", None, b"", 400, "empty"),
    ("api/generate", {"prompt": "x"}, None, 400, "model is required"),
    ("api/generate", {"model": 5}, None, 400, "model"),
    ("api/generate", {"model": "../../etc/passwd"}, None, 400, "invalid model name"),
    ("api/generate", {"model": "tiny", "prompt": 5}, None, 400, "prompt must be a string"),
    ("api/generate", {"model": "tiny", "stream": "yes"}, None, 400, "stream must be a boolean"),
    ("api/generate", {"model": "tiny", "options": []}, None, 400, "options must be an object"),
    (
        "api/generate",
        {"model": "tiny", "options": {"temperature": "hot"}},
        None,
        400,
        "options.temperature must be a number",
    ),
    ("api/generate", {"model": "tiny", "options": {"num_ctx": 0}}, None, 400, "options.num_ctx"),
    (
        "api/generate",
        {"model": "tiny", "options": {"num_predict": 1.5}},
        None,
        400,
        "options.num_predict must be an integer",
    ),
    ("api/generate", {"model": "tiny", "options": {"stop": [1]}}, None, 400, "options.stop"),
    (
        "api/generate",
        {"model": "tiny", "options": {"bogus": 1, "top_k": "x"}},  # unknown: ignored, warned
        None,
        400,
        "options.top_k must be an integer",
    ),
    ("api/generate", {"model": "tiny", "keep_alive": [1]}, None, 400, "keep_alive"),
    ("api/generate", {"model": "tiny", "keep_alive": "10 minutes"}, None, 400, "keep_alive"),
    ("api/generate", {"model": "tiny", "format": 7}, None, 400, "invalid format: 7"),
    ("api/chat", {"model": "tiny", "messages": "hi"}, None, 400, "messages must be a list"),
    (
        "api/chat",
        {"model": "tiny", "messages": [{"role": "bot", "content": "x"}]},
        None,
        400,
        "messages[0].role",
    ),
    (
        "api/chat",
        {"model": "tiny", "messages": [{"role": "user", "content": 3}]},
        None,
        400,
        "messages[0].content",
    ),
    ("api/create", {"model": "x"}, None, 400, "files is required"),
    ("api/create", {"model": "x", "files": {"a.gguf": "md5:1"}}, None, 400, "invalid files"),
    (
        "api/create",
        {"model": "x", "files": {"a.gguf": "sha256:" + "a" * 64}},
        None,
        400,
        "not been uploaded",
    ),
    ("api/generate", {"model": "missing"}, None, 404, "model 'missing:latest' not found"),
    ("api/chat", {"model": "missing", "messages": []}, None, 404, "not found"),
]


@pytest.mark.parametrize(("path", "body", "raw", "status", "match"), BAD_INPUTS)
async def test_bad_input(jp_fetch, installed_model, path, body, raw, status, match):
    await expect_error(jp_fetch, path, body, status, match, raw=raw)


async def test_unauthenticated_requests_refused(jp_base_url, http_server, http_server_port):
    client = AsyncHTTPClient(force_instance=True)
    base = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/"
    for path, method, body in [
        ("version", "GET", None),
        ("tags", "GET", None),
        ("generate", "POST", b"{}"),
        ("blobs/sha256:" + "0" * 64, "POST", b"x"),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await client.fetch(base + path, method=method, body=body, request_timeout=10)
        assert info.value.code == 403, path


async def test_runner_killed_mid_stream_then_recovers(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, endless_model
):
    await post(jp_fetch, "api/generate", {"model": "endless"})  # load
    scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
    pid = scheduler.loaded_models()[0].runner.pid
    runner = psutil.Process(pid)  # psutil refuses to signal a pid that was reused

    # the generation in flight when the runner dies ends with an error line naming
    # the cause; the kill follows the first streamed token
    chunks: list[bytes] = []

    def on_chunk(data: bytes) -> None:
        chunks.append(data)
        if runner.is_running():
            runner.send_signal(signal.SIGKILL)

    client = AsyncHTTPClient(force_instance=True)
    token = jp_serverapp.identity_provider.token
    body = {"model": "endless", "prompt": "go", "options": {**GREEDY, "num_predict": FOREVER}}
    await client.fetch(
        f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/generate",
        method="POST",
        body=json.dumps(body),
        headers={"Authorization": f"token {token}"},
        streaming_callback=on_chunk,
        request_timeout=120,
    )
    streamed = [json.loads(x) for x in b"".join(chunks).decode().splitlines() if x.strip()]
    assert streamed[0]["done"] is False  # the kill came after the first token
    assert "SIGKILL" in streamed[-1]["error"]

    # the next request gets a fresh runner
    r = await post(
        jp_fetch,
        "api/generate",
        {
            "model": "endless",
            "prompt": "again",
            "stream": False,
            "options": {**GREEDY, "num_predict": 3},
        },
    )
    assert json.loads(r.body)["eval_count"] == 3
    assert scheduler.loaded_models()[0].runner.pid != pid


async def test_shutdown_leaves_no_runner(jp_fetch, jp_serverapp, installed_model):
    await post(jp_fetch, "api/generate", {"model": "tiny"})
    scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
    pid = scheduler.loaded_models()[0].runner.pid
    assert psutil.pid_exists(pid)
    await jp_serverapp.extension_manager.stop_all_extensions()
    gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert gone


async def test_bearer_token_accepted(jp_serverapp, jp_base_url, http_server, http_server_port):
    client = AsyncHTTPClient(force_instance=True)
    token = jp_serverapp.identity_provider.token
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/version"
    r = await client.fetch(url, headers={"Authorization": f"Bearer {token}"}, request_timeout=10)
    assert r.code == 200


async def test_client_disconnect_cancels_generation(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, endless_model
):
    import asyncio

    await post(jp_fetch, "api/generate", {"model": "endless"})  # load
    scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
    loaded = scheduler.loaded_models()[0]
    token = jp_serverapp.identity_provider.token
    body = json.dumps(
        {"model": "endless", "prompt": "go", "options": {"num_predict": FOREVER, "temperature": 0}}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write(
        f"POST {jp_base_url}llm/api/generate HTTP/1.1\r\nHost: 127.0.0.1:{http_server_port[1]}\r\n"
        f"Authorization: token {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b'"done": false'), 30)  # streaming has started
    assert loaded.refcount == 1
    writer.close()

    await until(lambda: loaded.refcount == 0, 30, "the request's release")  # within a few tokens
    assert loaded.expires_at is not None
    # seen through /api/ps: the keep_alive timer runs (expires_at stays put while
    # the runner goes on to stop)
    first = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"][0]["expires_at"]

    async def idle() -> bool:
        return (await loaded.runner.process.call("health"))["busy"] is None

    await until(idle, 30, "the runner to stop")  # within a token or so
    again = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"][0]["expires_at"]
    assert first == again


async def test_generate_context_continues_a_conversation(jp_fetch, installed_model):
    opts = {**GREEDY, "num_predict": 4}
    first = json.loads(
        (
            await post(
                jp_fetch,
                "api/generate",
                {"model": "tiny", "prompt": "hi", "stream": False, "options": opts},
            )
        ).body
    )
    assert first["context"] and all(isinstance(t, int) for t in first["context"])
    follow = json.loads(
        (
            await post(
                jp_fetch,
                "api/generate",
                {
                    "model": "tiny",
                    "prompt": "more",
                    "stream": False,
                    "context": first["context"],
                    "options": opts,
                },
            )
        ).body
    )
    assert follow["prompt_eval_count"] > len(first["context"])
    assert follow["context"][: len(first["context"])] == first["context"]
    await expect_error(
        jp_fetch,
        "api/generate",
        {"model": "tiny", "prompt": "x", "context": [10**9]},
        400,
        "context",
    )


async def test_generate_template_and_raw(jp_fetch, installed_model):
    opts = {**GREEDY, "num_predict": 2}
    templated = json.loads(
        (
            await post(
                jp_fetch,
                "api/generate",
                {
                    "model": "tiny",
                    "prompt": "hi",
                    "system": "S",
                    "stream": False,
                    "options": opts,
                    "template": "{{ if .System }}[{{ .System }}]{{ end }}Q: {{ .Prompt }} A:",
                },
            )
        ).body
    )
    raw = json.loads(
        (
            await post(
                jp_fetch,
                "api/generate",
                {
                    "model": "tiny",
                    "prompt": "[S]Q: hi A:",
                    "raw": True,
                    "stream": False,
                    "options": opts,
                },
            )
        ).body
    )
    assert templated["response"] == raw["response"]
    assert templated["prompt_eval_count"] == raw["prompt_eval_count"]
    await expect_error(
        jp_fetch,
        "api/generate",
        {"model": "tiny", "prompt": "x", "template": "{{ range .Messages }}{{ end }}"},
        400,
        "range .Messages",
    )


async def test_generate_suffix_fill_in_the_middle(jp_fetch, installed_model):
    r = json.loads(
        (
            await post(
                jp_fetch,
                "api/generate",
                {
                    "model": "tiny",
                    "prompt": "def f(",
                    "suffix": "    return x",
                    "stream": False,
                    "options": {**GREEDY, "num_predict": 3},
                },
            )
        ).body
    )
    assert r["eval_count"] == 3
    assert r["prompt_eval_count"] == 3 + len("def f(") + len("    return x")  # byte tokens


async def test_an_image_that_is_not_one_is_refused(jp_fetch, installed_model):
    await expect_error(  # "hi": base64, but not an image (test_vision_api.py has the rest)
        jp_fetch,
        "api/generate",
        {"model": "tiny", "prompt": "x", "images": ["aGk="]},
        400,
        "images[0] is not an image",
    )


async def test_json_body_size_is_bounded(jp_fetch, installed_model):
    big = json.dumps({"model": "tiny", "prompt": "x" * (33 << 20)})
    with pytest.raises(HTTPClientError) as info:
        await post(jp_fetch, "api/generate", None, raw=big)
    assert info.value.code == 413


async def test_embed_truncate(jp_fetch, installed_model):
    long_text = "ab " * 1500  # more tokens than the demo model's 2048 context
    r = await post(jp_fetch, "api/embed", {"model": "tiny", "input": long_text})
    assert len(json.loads(r.body)["embeddings"][0]) == 64
    await expect_error(
        jp_fetch,
        "api/embed",
        {"model": "tiny", "input": long_text, "truncate": False},
        400,
        "exceeds the context length",
    )
    await expect_error(
        jp_fetch,
        "api/embed",
        {"model": "tiny", "input": [1]},
        400,
        "input must be a string or a list of strings",
    )
    await expect_error(
        jp_fetch, "api/embed", {"model": "tiny", "input": "x", "dimensions": 0}, 400, "dimensions"
    )


async def test_a_long_prompt_reaches_the_runner_encoded_off_the_event_loop(
    jp_fetch, installed_model, monkeypatch
):
    import threading

    from jupyter_llm.runner_client import process

    encoded_where: list[tuple[int, bool]] = []

    def encode(message):
        encoded_where.append(
            (
                len(message.get("prompt") or ""),
                threading.current_thread() is threading.main_thread(),
            )
        )
        return original(message)

    original = process.encode
    monkeypatch.setattr(process, "encode", encode)
    prompt = "ab " * 70_000  # 210 KB: longer than the context, truncated in the runner
    r = await post(
        jp_fetch,
        "api/generate",
        {
            "model": "tiny",
            "prompt": prompt,
            "raw": True,
            "stream": False,
            "options": {"num_predict": 1},
        },
    )
    assert json.loads(r.body)["done"]
    assert (len(prompt), False) in encoded_where  # not on the loop's thread
    assert all(on_loop for size, on_loop in encoded_where if size < 1000)  # small ones are


async def test_a_large_whole_answer_is_encoded_off_the_event_loop(
    jp_fetch, installed_model, monkeypatch
):
    import threading

    from jupyter_llm.api import base

    encoded_on_loop: list[bool] = []

    def next_chunk(pieces):
        encoded_on_loop.append(threading.current_thread() is threading.main_thread())
        return original(pieces)

    original = base.next_chunk
    monkeypatch.setattr(base, "next_chunk", next_chunk)
    body = {"model": "tiny", "prompt": "hi", "stream": False, "logprobs": True, "top_logprobs": 20}
    r = await post(jp_fetch, "api/generate", {**body, "options": {"num_predict": 120}})
    answer = json.loads(r.body)
    assert len(answer["logprobs"]) == answer["eval_count"] and len(r.body) > 64 << 10
    assert encoded_on_loop and not any(encoded_on_loop)  # a chunk at a time, each off the loop
    encoded_on_loop.clear()
    r = await post(jp_fetch, "api/generate", {**body, "options": {"num_predict": 2}})
    assert json.loads(r.body)["done"] and encoded_on_loop == []  # small: on the loop, whole


async def test_a_large_streamed_value_is_encoded_off_the_event_loop(
    jp_fetch, endless_model, monkeypatch
):
    """A stream's last value carries the exchange's tokens (11 contexts of
    them at most: 1.4M ids took 147 ms to encode on the loop); past
    DECODE_ON_LOOP_BYTES it is encoded off the loop, a piece at a time."""
    import threading

    from jupyter_llm.api import base

    encoded: list[bool] = []  # on the loop?
    original = base.Framing.encode_in_pieces

    def encode_in_pieces(self, value):
        encoded.append(threading.current_thread() is threading.main_thread())
        return original(self, value)

    monkeypatch.setattr(base.Framing, "encode_in_pieces", encode_in_pieces)
    context = [200 + i % 60 for i in range(20_000)]  # over 64 KiB as JSON
    body = {"model": "endless", "prompt": "hi", "context": context, "options": {"num_predict": 2}}
    r = await post(jp_fetch, "api/generate", body)
    lines = [json.loads(line) for line in r.body.decode().splitlines()]
    assert lines[-1]["done"] and lines[-1]["context"][: len(context)] == context
    assert encoded == [False]  # the last value only, off the loop
    assert all(line.get("response") is not None for line in lines)  # the wire as before


# -- embedding batches larger than one message of the runner channel --------------------
def serving_runner(jp_serverapp):
    (loaded,) = jp_serverapp.web_app.settings["jupyter_llm"].scheduler.loaded_models()
    return loaded.runner


async def test_an_embedding_batch_larger_than_one_channel_message(
    jp_fetch, jp_serverapp, installed_model, monkeypatch
):
    # The channel takes lines of at most STREAM_LIMIT bytes (64 MiB; 780 vectors
    # of 4096 dimensions). Here it is 256 KiB, and 800 vectors of 64 dimensions
    # are over 300 KiB of JSON even at 5 characters a number.
    from jupyter_llm.runner_client import process

    monkeypatch.setattr(process, "STREAM_LIMIT", 256 << 10)
    texts = [f"text number {i}" for i in range(800)]
    r = await post(jp_fetch, "api/embed", {"model": "tiny", "input": texts})
    body = json.loads(r.body)
    assert len(body["embeddings"]) == 800 and {len(v) for v in body["embeddings"]} == {64}
    assert len(json.dumps(body["embeddings"])) > 300 << 10
    runner = serving_runner(jp_serverapp)
    assert runner.alive
    for i in (0, 437, 799):  # each vector is the one that input gets alone, in order
        alone = json.loads(
            (await post(jp_fetch, "api/embed", {"model": "tiny", "input": texts[i]})).body
        )
        # (its last bits may differ: the final layer runs on one row alone, on 64 in a chunk)
        assert vectors_close(alone["embeddings"][0], body["embeddings"][i])
    assert serving_runner(jp_serverapp) is runner  # the same runner all along


# embedding bounds (EMBED_INPUTS, EMBED_TOKENS): tests/attacks/test_embed_fair.py


async def test_the_model_is_echoed_as_the_request_wrote_it(jp_fetch, installed_model):
    """Ollama answers ``Model: req.Model``, in any case and with or without
    its tag (the store reads the name in any case, as Ollama's does)."""
    for written in ("TINY", "tiny:latest", "Tiny"):
        body = {"model": written, "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
        r = await post(jp_fetch, "api/generate", body)
        assert json.loads(r.body)["model"] == written
    ask = [{"role": "user", "content": "hi"}]
    chat = {"model": "Tiny:latest", "messages": ask, "max_tokens": 1}
    r = await post(jp_fetch, "v1/chat/completions", chat)
    assert json.loads(r.body)["model"] == "Tiny:latest"
