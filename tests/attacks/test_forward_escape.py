"""A user's server that forwards to a shared engine (``api.forward``) never
sends a request outside the engine's ``llm/`` prefix: before the fix,
``GET {base}llm/v1/models/../../../../hub/api/user`` reached the engine's host
at ``/hub/api/user`` with the engine token.

The "engine" here is a loopback HTTP server that records every request it
receives (path and Authorization header). The attacks go to the real
forwarding Jupyter server as raw HTTP over a socket, so that no client library
resolves or re-encodes the dots on the way."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest

from jupyter_llm.api.forward import has_dot_segment, inside, route_path
from jupyter_llm.request.errors import InvalidRequest

PREFIX = "/services/engine/llm/"  # the engine's API, as a Hub service
ENGINE_TOKEN = "engine-secret-token"
DEADLINE = 30.0
POLL = 0.01  # how often the recording engine checks whether it should stop


class Recorder(BaseHTTPRequestHandler):
    """Answers every request with ``{}`` and records (method, raw path, auth)."""

    seen: list[tuple[str, str, str]]

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def engine() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """The recording engine's API URL and what it has received."""
    seen: list[tuple[str, str, str]] = []
    handler = type("Recording", (Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for serve_forever's next poll: 0.5 s apart by default, per test
    thread = threading.Thread(target=server.serve_forever, args=(POLL,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}{PREFIX}", seen
    server.shutdown()
    server.server_close()
    thread.join(DEADLINE)


@pytest.fixture
def llm_config(engine, monkeypatch) -> dict:
    monkeypatch.setenv("JUPYTER_LLM_ENGINE_TOKEN", ENGINE_TOKEN)
    return {"engine_url": engine[0]}


async def raw_request(port: int, token: str, method: str, target: str) -> tuple[int, bytes]:
    """Send ``method target`` exactly as written; the status and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: token {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()
    header, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = header.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    if headers.get("transfer-encoding") == "chunked":
        body = dechunked(body)
    return int(status_line.split()[1]), body


def dechunked(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2 :]
    return out


def no_dot_segment(path: str) -> bool:
    """The test's own reading: decoded three times, no "." or ".." segment."""
    for _ in range(3):
        path = unquote(path)
    return not any(p in (".", "..") for p in path.replace("\\", "/").split("/"))


TRAVERSALS = [
    ("GET", "v1/models/../../../../hub/api/user"),
    ("GET", "v1/models/%2e%2e/%2e%2e/%2e%2e/%2e%2e/hub/api/user"),
    ("GET", "v1/models/%2E%2E%2F%2E%2E%2F%2E%2E%2F%2E%2E%2Fhub%2Fapi%2Fuser"),
    ("GET", "v1/models/.%2e/%2E./..%2f%2e%2E/hub/api/user"),  # mixed
    ("GET", "v1/models/library/x/..%2F..%2F..%2F..%2F..%2Fhub"),
    ("GET", "v1/models/%252e%252e/%252e%252e/%252e%252e/%252e%252e/hub/api/user"),
    ("GET", "v1/models/..%5c..%5c..%5c..%5chub%5capi%5cuser"),
    ("GET", "v1/models/./x"),
    ("HEAD", "api/blobs/.."),
    ("HEAD", "api/blobs/%2e%2e%2f%2e%2e%2f%2e%2e%2fhub%2fapi%2fuser"),
    ("POST", "api/blobs/sha256:..%2F..%2F..%2F..%2Fhub"),
    ("DELETE", "api/blobs/%2E%2E"),
]


@pytest.mark.parametrize(("method", "path"), TRAVERSALS)
async def test_a_traversal_is_refused_and_never_reaches_the_engine(
    jp_serverapp, jp_base_url, http_server, http_server_port, engine, method, path
):
    _, seen = engine
    token = jp_serverapp.identity_provider.token
    status, body = await raw_request(http_server_port[1], token, method, f"{jp_base_url}llm/{path}")
    assert status in (400, 404, 405), (status, body)
    assert seen == []  # refused here: the engine saw nothing, escaped or not
    if status == 400 and method != "HEAD":
        error = json.loads(body)["error"]
        message = error["message"] if path.startswith("v1/") else error  # each API's shape
        assert "'.' and '..'" in message, message


async def test_the_engine_sees_only_paths_under_its_prefix(
    jp_serverapp, jp_base_url, http_server, http_server_port, engine
):
    """Traversals and ordinary requests mixed: whatever arrives upstream is under
    the prefix, with no dot segment, and the ordinary ones arrive as sent."""
    _, seen = engine
    token = jp_serverapp.identity_provider.token
    port = http_server_port[1]
    digest = "sha256:" + "ab" * 32
    ordinary = [
        ("GET", "v1/models/library/tiny:latest", 200),
        ("GET", "api/tags", 200),
        ("HEAD", f"api/blobs/{digest}", 200),
        ("HEAD", "api/blobs/a%2Fb", 200),  # an encoded slash stays inside one segment
        ("GET", "v1/models/hf.co/u/r:Q4_K_M?x=1", 200),
    ]
    statuses = []
    for method, path in [*TRAVERSALS, *((m, p) for m, p, _ in ordinary)]:
        status, _ = await raw_request(port, token, method, f"{jp_base_url}llm/{path}")
        statuses.append(status)
    assert statuses[len(TRAVERSALS) :] == [s for _, _, s in ordinary]
    assert all(s in (400, 404, 405) for s in statuses[: len(TRAVERSALS)])
    assert [(m, p) for m, p, _ in seen] == [
        ("GET", f"{PREFIX}v1/models/library/tiny:latest"),
        ("GET", f"{PREFIX}api/tags"),
        ("HEAD", f"{PREFIX}api/blobs/{digest}"),
        ("HEAD", f"{PREFIX}api/blobs/a%2Fb"),
        ("GET", f"{PREFIX}v1/models/hf.co/u/r:Q4_K_M?x=1"),
    ]
    for _, path, auth in seen:
        assert path.startswith(PREFIX) and no_dot_segment(path), path
        assert auth == f"token {ENGINE_TOKEN}"


# -- the pieces, without a server ------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "dots"),
    [
        ("v1/models/../x", True),
        ("v1/models/%2e%2E/x", True),
        ("v1/models/x%2F%2e%2e", True),
        ("v1/models/%25252e%25252e", True),  # three encodings deep
        ("v1/models/..%5cx", True),
        ("api/blobs/.", True),
        ("v1/models/x..y/.z/a.", False),
        ("v1/models/llama3.2:1b", False),
        ("v1/models/hf.co/user/repo.gguf", False),
    ],
)
def test_has_dot_segment(path, dots):
    assert has_dot_segment(path) is dots


def test_route_parameters_are_quoted_again():
    blob = "api/blobs/(?P<digest>[^/]+)"
    model = "v1/models/(?P<model>.+)"
    assert route_path(blob, {"digest": "a/b?c#d%"}) == "api/blobs/a%2Fb%3Fc%23d%25"
    assert route_path(blob, {"digest": "sha256:" + "0" * 64}) == "api/blobs/sha256:" + "0" * 64
    assert route_path(model, {"model": "hf.co/u/r:Q4 K"}) == "v1/models/hf.co/u/r:Q4%20K"


def test_the_final_url_must_stay_under_the_engines_url():
    base = "http://engine:8000/services/llm/"
    assert str(inside(base, "api/tags?x=1")) == f"{base}api/tags?x=1"
    for escape in ("../../hub/api/user", "v1/../../x", "./../x"):
        with pytest.raises(InvalidRequest):
            inside(base, escape)
    with pytest.raises(InvalidRequest):  # another host, were a base to lack its "/"
        inside("http://engine", "@evil.example/x")
