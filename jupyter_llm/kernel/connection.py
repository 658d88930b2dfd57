"""Finding the engine and talking to it.

Order: ``JUPYTER_LLM_URL`` (+ ``JUPYTER_LLM_TOKEN``); else the Jupyter server
that started this kernel (its ``jpserver-<pid>.json``, matched by
``JPY_PARENT_PID``); else the only running server that has the extension; else
an embedded engine: the same extension app served on a private loopback port
with a random token, from a background thread of this process.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


class LLMClientError(Exception):
    """What the server (or the connection to it) said went wrong, in one line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Engine:
    url: str  # the Jupyter server's base URL, ending in "/"
    token: str
    kind: str  # "env", "server" or "embedded"

    @property
    def llm_url(self) -> str:
        return f"{self.url}llm"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    def http(self, timeout: float | None = 600.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.llm_url + "/",
            headers=self.headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """One JSON request; a server error becomes ``LLMClientError``."""
        with self.http() as client:
            try:
                response = client.request(method, path, json=body, **kwargs)
            except httpx.HTTPError as e:
                raise LLMClientError(f"cannot reach jupyter-llm at {self.llm_url}: {e}") from e
            _raise_for_error(response)
            if not response.content:
                return None
            try:
                return response.json()
            except ValueError:
                return [json.loads(x) for x in response.text.splitlines() if x.strip()]

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """NDJSON objects as they arrive; an ``{"error"}`` line raises."""
        with self.http() as client:
            try:
                with client.stream("POST", path, json=body) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for_error(response)
                    for line in response.iter_lines():
                        if not line.strip():
                            continue
                        item = json.loads(line)
                        if "error" in item:
                            raise LLMClientError(str(item["error"]))
                        yield item
            except httpx.HTTPError as e:
                raise LLMClientError(f"connection to jupyter-llm lost: {e}") from e

    def ollama_client(self) -> Any:
        import ollama

        return ollama.Client(host=self.llm_url, headers=self.headers)

    def openai_client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.llm_url}/v1", api_key=self.token or "none")


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    raise LLMClientError(message or f"HTTP {response.status_code}", response.status_code)


def find_engine(embedded: bool = True) -> Engine:
    if url := os.environ.get("JUPYTER_LLM_URL"):
        return Engine(url.rstrip("/") + "/", os.environ.get("JUPYTER_LLM_TOKEN", ""), "env")
    servers = [s for s in _running_servers() if _has_extension(s)]
    parents = {os.environ.get("JPY_PARENT_PID"), str(os.getppid())} - {None}
    mine = [s for s in servers if str(s.get("pid")) in parents]
    if mine or len(servers) == 1:
        chosen = (mine or servers)[0]
        return Engine(chosen["url"], chosen.get("token", ""), "server")
    if not embedded:
        if servers:
            raise LLMClientError(
                "several Jupyter servers run jupyter-llm: set JUPYTER_LLM_URL "
                "and JUPYTER_LLM_TOKEN to choose one"
            )
        raise LLMClientError("no running Jupyter server with jupyter-llm was found")
    return start_embedded()


def _running_servers() -> list[dict[str, Any]]:
    try:
        from jupyter_server.serverapp import list_running_servers

        return list(list_running_servers())
    except Exception:
        return []


def _has_extension(info: dict[str, Any]) -> bool:
    engine = Engine(info["url"], info.get("token", ""), "server")
    try:
        with engine.http(timeout=3.0) as client:
            return client.get("api/version").status_code == 200
    except httpx.HTTPError:
        return False


# -- embedded mode ---------------------------------------------------------------------
_embedded: dict[str, Any] = {}
_lock = threading.Lock()


def start_embedded() -> Engine:
    """The extension app on a private loopback port, served from a daemon thread
    (its own event loop; the host's signals and event loop are left alone)."""
    with _lock:
        if "engine" in _embedded:
            return _embedded["engine"]
        port, token = _free_port(), secrets.token_hex(24)
        ready, failure = threading.Event(), []
        thread = threading.Thread(
            target=_serve,
            args=(port, token, ready, failure),
            name="jupyter-llm-embedded",
            daemon=True,
        )
        thread.start()
        if not ready.wait(120) or failure:
            raise LLMClientError(f"could not start the embedded engine: {failure or 'timeout'}")
        engine = Engine(f"http://127.0.0.1:{port}/", token, "embedded")
        _embedded["engine"] = engine
        atexit.register(stop_embedded)
        return engine


def stop_embedded() -> None:
    app, loop = _embedded.pop("app", None), _embedded.pop("loop", None)
    _embedded.pop("engine", None)
    if app is None or loop is None or loop.is_closed():
        return

    done = asyncio.run_coroutine_threadsafe(app._cleanup(), loop)  # stops every runner
    try:
        done.result(timeout=30)
    except Exception:
        pass
    loop.call_soon_threadsafe(loop.stop)


def _serve(port: int, token: str, ready: threading.Event, failure: list[str]) -> None:
    from jupyter_server.serverapp import ServerApp

    class EmbeddedServerApp(ServerApp):
        def init_signal(self) -> None:  # the host process keeps its own signal handlers
            pass

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        from traitlets.config import Config

        config = Config({"ServerApp": {"jpserver_extensions": {"jupyter_llm": True}}})
        app = EmbeddedServerApp(config=config)
        app.initialize(
            argv=[
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={token}",
                "--ServerApp.open_browser=False",
                "--ServerApp.allow_root=True",
                f"--ServerApp.root_dir={tempfile.gettempdir()}",
                "--ServerApp.log_level=WARN",
            ],
            find_extensions=False,
            new_httpserver=True,
        )
        loop.run_until_complete(app.extension_manager.start_all_extensions())
    except BaseException as e:  # report to the waiting thread whatever went wrong
        failure.append(f"{type(e).__name__}: {e}")
        ready.set()
        return
    _embedded.update(app=app, loop=loop)
    ready.set()
    loop.run_forever()
    loop.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
