"""``jupyter llm serve``: the engine alone, as a JupyterHub-managed service.

A plain tornado application hosting the same handlers as the extension
(``api.handlers``, the same ``LLMServices``) under the service's prefix
(``$JUPYTERHUB_SERVICE_PREFIX``, e.g. ``/services/llm/``), listening where the
Hub says (``$JUPYTERHUB_SERVICE_URL``), authenticated by the Hub (``hub.auth``).
Users' servers point at it with ``JUPYTER_LLM_ENGINE_URL`` (``api.forward``).
``metrics`` under the prefix serves Prometheus metrics to a Hub token.
SIGTERM or SIGINT (the Hub stops its services so) stops every runner.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import logging
import os
import signal
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.base.handlers import PrometheusMetricsHandler
from jupyter_server.log import log_request
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_llm.api import handlers
from jupyter_llm.api.base import http_error_message
from jupyter_llm.config import Settings, env_name
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.services import LLMServices, build_services

log = logging.getLogger("jupyter_llm.hub")

DEFAULT_PREFIX = "/services/llm/"


@dataclass(frozen=True)
class Where:
    """The address to listen on and the URL prefix of every route."""

    host: str
    port: int
    prefix: str  # starts and ends with "/"


def where(url: str, prefix: str) -> Where:
    """From the service's URL (``http://127.0.0.1:8765``) and prefix."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ConfigError(
            f"the service URL must be http://HOST:PORT (the `url` of the Hub's service entry); "
            f"got {url!r}"
        )
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    return Where(parts.hostname, parts.port, prefix)


class MetricsHandler(PrometheusMetricsHandler):
    """jupyter_server's /metrics with the engine's JSON errors: its own error
    page needs a ServerApp's templates, which this engine has none of (a
    refused scrape could log "Uncaught exception in write_error" and answer
    an empty body)."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, web.HTTPError):
            message = http_error_message(exc, message)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))


def make_app(services: LLMServices, prefix: str) -> web.Application:
    """The handlers under ``prefix``, with the Hub as identity provider."""
    from jupyter_llm.hub.auth import HubAuthorizer, HubIdentityProvider

    identity = HubIdentityProvider()
    # jupyter_server's own /metrics handler (our collectors are in its registry),
    # before the table's catch-all 404; authenticate_prometheus: a Hub token only
    routes: list[tuple[str, type[web.RequestHandler]]] = [(f"{prefix}metrics", MetricsHandler)]
    routes += [(f"{prefix}{path}", handler) for path, handler in handlers()]
    return web.Application(
        routes,
        base_url=prefix,
        jupyter_llm=services,
        identity_provider=identity,
        authorizer=HubAuthorizer(identity_provider=identity),
        serverapp=None,
        # jupyter_server's access log: who asked; failures only (successes are debug)
        log_function=partial(log_request, record_prometheus_metrics=False),
        # every request is authenticated by the Hub, whatever Host the proxy kept;
        # by token only (no cookie), so there is no cross-site request to forge
        allow_remote_access=True,
        disable_check_xsrf=True,
        allow_unauthenticated_access=False,
        authenticate_prometheus=True,
    )


async def serve(settings: Settings, at: Where) -> int:
    """Serve until SIGTERM or SIGINT, then stop every runner."""
    try:
        services = build_services(settings)
    except ConfigError as e:  # a Ray address without Ray
        log.critical("jupyter llm serve: %s", e)
        return 1
    atexit.register(services.kill)
    services.start()
    server = HTTPServer(make_app(services, at.prefix))
    server.listen(at.port, at.host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "jupyter-llm engine at http://%s:%d%s (models in %s)",
        at.host, at.port, at.prefix, settings.models_dir,
    )  # fmt: skip
    try:
        await stop.wait()
        log.info("jupyter-llm engine stopping: unloading every model")
    finally:
        server.stop()
        await services.stop()
        await server.close_all_connections()
    return 0


def main(args: argparse.Namespace) -> int:
    """``jupyter llm serve``; ``args``: ``url``, ``prefix`` (None: the Hub's)."""
    logging.basicConfig(format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    logging.getLogger("jupyter_llm").setLevel(logging.INFO)
    try:
        import jupyterhub.services.auth  # noqa: F401
    except ImportError:
        log.critical("jupyter llm serve needs JupyterHub: pip install 'jupyter-llm[hub]'")
        return 1
    url = args.url or os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    prefix = args.prefix or os.environ.get("JUPYTERHUB_SERVICE_PREFIX", DEFAULT_PREFIX)
    try:
        if not url:
            raise ConfigError(
                "no address to listen on: run it as a JupyterHub service with a `url` "
                "(the Hub sets JUPYTERHUB_SERVICE_URL), or pass --url"
            )
        if not os.environ.get("JUPYTERHUB_API_URL"):
            raise ConfigError("JUPYTERHUB_API_URL is not set: run it as a JupyterHub service")
        settings = Settings.from_env()
        if settings.engine_url:
            raise ConfigError(
                f"{env_name('engine_url')} is for users' servers: the engine itself must "
                "not have it (it would forward to itself)"
            )
        at = where(url, prefix)
    except ConfigError as e:
        log.critical("jupyter llm serve: %s", e)
        return 1
    return asyncio.run(serve(settings, at))
