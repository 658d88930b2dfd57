"""The embedded engine: the same extension app served on a private loopback
port with a random token, from a daemon thread of this process. For when no
Jupyter server with jupyter-llm runs (plain IPython, a script, the CLI alone);
``discovery`` decides when."""

from __future__ import annotations

import asyncio
import atexit
import secrets
import socket
import tempfile
import threading
from typing import Any

from jupyter_llm.connect.endpoint import LLMClientError, ServerEndpoint

_embedded: dict[str, Any] = {}
_lock = threading.Lock()


def start_embedded() -> ServerEndpoint:
    """The extension app on a private loopback port, served from a daemon thread
    (its own event loop; the host's signals and event loop are left alone)."""
    with _lock:
        if "endpoint" in _embedded:
            return _embedded["endpoint"]
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
        endpoint = ServerEndpoint(f"http://127.0.0.1:{port}/", token, "embedded")
        _embedded["endpoint"] = endpoint
        atexit.register(stop_embedded)
        return endpoint


def stop_embedded() -> None:
    app, loop = _embedded.pop("app", None), _embedded.pop("loop", None)
    _embedded.pop("endpoint", None)
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
                # the host's output is its own: the server's and the extension's
                # INFO lines (each app has its own level) stay out of it
                "--ServerApp.log_level=WARN",
                "--LLMExtension.log_level=WARN",
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
