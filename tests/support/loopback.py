"""A loopback HTTP server speaking the protocols ``pull`` uses: an Ollama/Docker
registry (with token auth and CDN redirects), Hugging Face's model API and
file downloads, and plain file URLs, all with Range support and switches to
misbehave: drop the connection mid-blob (once, at given offsets, or every
time), answer with an error status, serve the wrong bytes, pause a
download at a known byte until the test lets it go on, send more than a
body's declared size (``Trick``), answer a resume with the wrong range.
File downloads carry an ETag and honour If-Range unless told not to."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEADLINE = 60.0  # no handler waits longer than this for a test


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Pause:
    """Send ``at`` bytes of a body, set ``reached``, wait for ``go``, send the
    rest (or, with ``drop``, close the connection instead)."""

    at: int
    drop: bool = False
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)


@dataclass
class Trick:
    """How to misanswer one path: ``extra`` bytes after the real body, a claimed
    Content-Length (``declared``) or none at all (``chunked``), and ``hang``:
    keep the connection open afterwards instead of ending the body."""

    extra: bytes = b""
    declared: int | None = None
    chunked: bool = False
    hang: bool = False


def etag(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest()[:16] + '"'


@dataclass
class Remote:
    blobs: dict[str, bytes] = field(default_factory=dict)  # digest -> content
    manifests: dict[str, bytes] = field(default_factory=dict)  # "ns/name/tag" -> JSON
    hf_repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # "u/r" -> files
    files: dict[str, bytes] = field(default_factory=dict)  # "/files/x.gguf" -> content
    token: str | None = None  # require Bearer auth on the registry
    realm: str | None = None  # the token URL a challenge names (default: this server's)
    drop_after: int | None = None  # send this many bytes of the next blob, then close
    drops: list[int] = field(default_factory=list)  # file offsets: each body stops at the next
    drop_each: int | None = None  # send at most this many bytes of every body, then close
    statuses: list[int] = field(default_factory=list)  # answer the next downloads with these
    corrupt: set[str] = field(default_factory=set)  # digests served with wrong bytes
    pauses: dict[str, Pause] = field(default_factory=dict)  # request path -> pause
    tricks: dict[str, Trick] = field(default_factory=dict)  # request path -> misanswer
    if_range: bool = True  # honour If-Range (a changed file is sent whole)
    wrong_range_start: bool = False  # answer any Range with 206 from byte 0
    if_ranges: list[str] = field(default_factory=list)  # If-Range headers seen
    ranges: list[str] = field(default_factory=list)  # Range headers seen
    requests: list[str] = field(default_factory=list)

    def add_model(self, ns: str, name: str, tag: str, gguf: bytes, extra=()) -> dict:
        config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
        layers = [("application/vnd.ollama.image.model", gguf), *extra]
        for _, data in [*layers, ("config", config)]:
            self.blobs[sha(data)] = data
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": sha(config),
                "size": len(config),
            },
            "layers": [{"mediaType": m, "digest": sha(d), "size": len(d)} for m, d in layers],
        }
        self.manifests[f"{ns}/{name}/{tag}"] = json.dumps(manifest).encode()
        return manifest


class LoopbackServer:
    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        handler = type("Handler", (_Handler,), {"remote": remote, "server_ref": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.host = f"127.0.0.1:{self.port}"
        self.closing = threading.Event()  # releases handlers told to hang
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    remote: Remote
    server_ref: LoopbackServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.do_GET(head=True)

    def do_GET(self, head: bool = False) -> None:
        try:
            self._get(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading, as a careful client should

    def _get(self, head: bool) -> None:
        r = self.remote
        path = self.path.split("?")[0]
        r.requests.append(f"{self.command} {self.path}")
        if path == "/token":
            return self._json({"token": r.token})
        if m := re.match(r"^/v2/([^/]+)/([^/]+)/manifests/([^/]+)$", path):
            if r.token and self.headers.get("Authorization") != f"Bearer {r.token}":
                realm = r.realm or f"{self.server_ref.base}/token"
                return self._send(
                    401,
                    b"{}",
                    {"WWW-Authenticate": f'Bearer realm="{realm}",service="test",scope="pull"'},
                )
            manifest = r.manifests.get("/".join(m.groups()))
            return self._send(200, manifest) if manifest else self._send(404, b"{}")
        if m := re.match(r"^/v2/[^/]+/[^/]+/blobs/(sha256:[0-9a-f]{64})$", path):
            # registries redirect blob downloads to a CDN
            return self._send(307, b"", {"Location": f"{self.server_ref.base}/cdn/{m.group(1)}"})
        if m := re.match(r"^/cdn/(sha256:[0-9a-f]{64})$", path):
            data = r.blobs.get(m.group(1))
            if data is not None and m.group(1) in r.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            return self._content(data, head)
        if m := re.match(r"^/api/models/([^/]+/[^/]+)$", path):
            files = r.hf_repos.get(m.group(1))
            if files is None:
                return self._send(404, b"{}")
            return self._json(
                {
                    "siblings": [
                        {"rfilename": f, "lfs": {"sha256": sha(d)[7:], "size": len(d)}}
                        for f, d in files.items()
                    ]
                    + [{"rfilename": "README.md"}]
                }
            )
        if m := re.match(r"^/([^/]+/[^/]+)/resolve/main/(.+)$", path):
            return self._send(
                302, b"", {"Location": f"{self.server_ref.base}/hfcdn/{m.group(1)}/{m.group(2)}"}
            )
        if m := re.match(r"^/hfcdn/([^/]+/[^/]+)/(.+)$", path):
            return self._content(r.hf_repos.get(m.group(1), {}).get(m.group(2)), head)
        if path in r.files:
            return self._content(r.files[path], head)
        self._send(404, b"{}")

    def _content(self, data: bytes | None, head: bool = False) -> None:
        r = self.remote
        pause = r.pauses.pop(self.path.split("?")[0], None) if not head else None
        if data is None:
            return self._send(404, b"{}")
        if r.statuses and not head:
            return self._send(r.statuses.pop(0), b"{}")
        start = 0
        status = 200
        headers = {"Accept-Ranges": "bytes", "ETag": etag(data)}
        if if_range := self.headers.get("If-Range"):
            r.if_ranges.append(if_range)
        rng = self.headers.get("Range")
        if rng and r.if_range and if_range and if_range != headers["ETag"]:
            rng = None  # RFC 9110: a changed representation is sent whole
        if rng:
            r.ranges.append(rng)
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                return self._send(416, b"")
            status = 206
            if r.wrong_range_start:
                start = 0
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if head:
            headers["Content-Length"] = str(len(body))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            return
        cut = None
        if r.drop_after is not None:
            cut, r.drop_after = r.drop_after, None
        elif r.drops and r.drops[0] > start:
            cut = r.drops.pop(0) - start
        elif r.drop_each is not None:
            cut = r.drop_each
        if cut is not None:
            self._start(status, len(body), headers)
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if pause is not None:
            self._start(status, len(body), headers)
            self.wfile.write(body[: pause.at])
            self.wfile.flush()
            pause.reached.set()
            pause.go.wait(DEADLINE)
            if pause.drop:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body[pause.at :])
            return
        self._send(status, body, headers)

    def _json(self, value: object) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _start(self, status: int, length: int | None, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        trick = self.remote.tricks.get(self.path.split("?")[0])
        if trick is None:
            self._start(status, len(body), headers or {})
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        body += trick.extra
        declared = None if trick.chunked else trick.declared or len(body)
        self._start(status, declared, headers or {})
        if self.command == "HEAD":
            return
        if trick.chunked:
            for i in range(0, len(body), 1 << 16):
                piece = body[i : i + (1 << 16)]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        else:
            self.wfile.write(body)
        self.wfile.flush()
        if trick.hang:
            self.server_ref.closing.wait(DEADLINE)
            self.close_connection = True
        elif trick.chunked:
            self.wfile.write(b"0\r\n\r\n")


async def pull_events(jp_fetch, body: dict, timeout: float = DEADLINE) -> list[dict]:
    """A pull's NDJSON events through the server; a pull that hangs fails the
    test at ``timeout``."""
    r = await asyncio.wait_for(
        jp_fetch(
            "llm", "api", "pull", method="POST", body=json.dumps(body), request_timeout=timeout
        ),
        timeout,
    )
    return [json.loads(x) for x in r.body.decode().splitlines() if x.strip()]
