"""The Jupyter server extension: builds the services once (``services.py``,
where ``LLMServices`` and ``build_services`` moved), mounts the handlers, and
kills every runner on shutdown.

With an engine URL (``LLMExtension.engine_url`` or ``JUPYTER_LLM_ENGINE_URL``,
which a JupyterHub spawner's environment sets) it starts no scheduler and no
runner: its routes forward to that shared engine (``api.forward``).

A bad configuration value (a trait or a ``JUPYTER_LLM_*`` variable) stops the
server with a message naming it: jupyter_server's extension manager would
otherwise log a warning and run on without jupyter-llm.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
from pathlib import Path
from typing import Any, NoReturn

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int, TraitError, Unicode, Union, validate

from jupyter_llm.api import forward, handlers
from jupyter_llm.config import Settings
from jupyter_llm.request import helper_process
from jupyter_llm.request.durations import parse_duration
from jupyter_llm.request.errors import ConfigError
from jupyter_llm.server_exit import install as end_process_at_exit
from jupyter_llm.services import LLMServices, build_services

SETTINGS_TRAITS = (
    "keep_alive",
    "context_length",
    "max_loaded_models",
    "num_parallel",
    "max_queue",
    "max_requests_per_user",
    "gpu_overhead",
    "new_estimates",
    "load_timeout",
    "stream_interval",
    "flash_attention",
    "kv_cache_type",
    "batch_invariant",
    "prompt_disk_cache",
    "prompt_disk_expiry",
    "prompt_disk_dir",
    "prompt_ram_cache",
    "num_threads",
    "python",
    "engine_url",
    "ray_address",
    "hf_endpoint",
    "trusted_auth_hosts",
    "history_interval",
)


def _duration(help: str) -> Union:
    """Seconds (a number) or a duration string like "10m", checked by ``_valid_duration``."""
    return Union([Float(), Unicode()], default_value=None, allow_none=True, config=True, help=help)


class LLMExtension(ExtensionApp):
    """Local LLMs in the Jupyter server. Traits override JUPYTER_LLM_* env vars."""

    name = "jupyter_llm"
    load_other_extensions = True

    models_dir = Unicode(None, allow_none=True, config=True, help="Model store directory.")
    keep_alive = _duration("How long an idle model stays loaded: seconds, or '10m'; -1: forever.")
    context_length = Int(None, allow_none=True, config=True, help="Default num_ctx.")
    max_loaded_models = Int(None, allow_none=True, config=True, help="0: 3 x GPUs (min 3).")
    num_parallel = Int(None, allow_none=True, config=True, help="Parallel requests per model.")
    max_queue = Int(None, allow_none=True, config=True, help="Bound of the pending queue.")
    max_requests_per_user = Int(
        None, allow_none=True, config=True, help="Concurrent requests per user; 0: no limit."
    )
    gpu_overhead = Int(None, allow_none=True, config=True, help="Bytes reserved per GPU.")
    new_estimates = Bool(None, allow_none=True, config=True, help="Use measured allocations.")
    load_timeout = _duration("Give up on a model load after this: seconds, or '5m'.")
    num_threads = Int(None, allow_none=True, config=True, help="CPU threads; 0: automatic.")
    stream_interval = Float(None, allow_none=True, config=True, help="Token grouping (s).")
    flash_attention = Unicode(
        None, allow_none=True, config=True, help="Flash attention: auto, on or off."
    )
    kv_cache_type = Unicode(
        None, allow_none=True, config=True, help="KV cache type: f16, q8_0 or q4_0."
    )
    batch_invariant = Bool(
        None, allow_none=True, config=True, help="Logits independent of batching (slower prompts)."
    )
    prompt_disk_cache = Int(
        None, allow_none=True, config=True, help="Bytes of prompt caches on disk; 0: off."
    )
    prompt_disk_expiry = _duration("Delete a prompt cache file unused this long: '24h'.")
    history_interval = _duration("Seconds between the sidebar history's samples: '2s'.")
    prompt_disk_dir = Unicode(
        None, allow_none=True, config=True, help="Prompt caches' folder; empty: beside the models."
    )
    prompt_ram_cache = Int(
        None, allow_none=True, config=True, help="Bytes of prompt caches in RAM per model; 0: off."
    )
    python = Unicode(
        None,
        allow_none=True,
        config=True,
        help="Interpreter for runner processes (a GPU build's environment, as "
        "`make lab GPU=...` sets it); empty: the server's own.",
    )

    engine_url = Unicode(
        None,
        allow_none=True,
        config=True,
        help="A shared engine's API URL (`jupyter llm serve` behind JupyterHub, e.g. "
        "http://127.0.0.1:8765/services/llm/): this server then starts no scheduler "
        "and forwards its /llm/ routes there, as its user.",
    )

    hf_endpoint = Unicode(
        None, allow_none=True, config=True, help="Hugging Face (or a mirror) for hf.co/ pulls."
    )
    trusted_auth_hosts = Unicode(
        None,
        allow_none=True,
        config=True,
        help="Token hosts trusted beside each registry's own ('host' or 'host:port', "
        "comma-separated).",
    )
    ray_address = Unicode(
        None,
        allow_none=True,
        config=True,
        help="A Ray cluster to run the models on ('auto', or the head's 'host:6379'; needs "
        "jupyter-llm[ray]); empty: runners on this machine.",
    )

    services: LLMServices | None = None  # None: the routes forward to ``engine``
    engine: forward.SharedEngine | None = None

    @validate("keep_alive", "load_timeout", "prompt_disk_expiry", "history_interval")
    def _valid_duration(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is not None:
            try:
                parse_duration(value, f"LLMExtension.{proposal['trait'].name}")
            except ValueError as e:
                raise TraitError(str(e)) from None
        return value

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        """The server's config reaches the traits here: a bad value stops the server."""
        try:
            super()._link_jupyter_server_extension(serverapp)
        except TraitError as e:
            self._refuse(serverapp, str(e))

    def build_settings(self) -> Settings:
        """The traits over the JUPYTER_LLM_* variables; ``ConfigError`` if a value is bad."""
        overrides = {name: getattr(self, name) for name in SETTINGS_TRAITS}
        if self.models_dir:
            overrides["models_dir"] = Path(self.models_dir)
        return Settings.from_env(**overrides)

    def initialize_settings(self) -> None:
        end_process_at_exit()  # no hang on an AnyIO worker at exit (server_exit)
        try:
            settings = self.build_settings()
            if not settings.engine_url:
                self.services = build_services(settings)  # ConfigError: ray_address without Ray
        except ConfigError as e:
            self._refuse(self.serverapp, str(e))
        self._share_log_config()
        if self.services is None:
            self.engine = forward.SharedEngine.connect(settings)
            self.settings.update({"jupyter_llm_engine": self.engine})
            self.log.info("jupyter-llm: using the shared engine at %s", settings.engine_url)
            return
        self.settings.update({"jupyter_llm": self.services})
        atexit.register(self.services.kill)
        self.log.info("jupyter-llm: models in %s", settings.models_dir)

    @staticmethod
    def _refuse(serverapp: Any, message: str) -> NoReturn:
        """Exit rather than raise: the extension manager catches every
        ``Exception`` of an extension, logs a warning and starts the server
        without it. ``SystemExit`` passes through and stops the server."""
        serverapp.log.critical(
            "jupyter-llm: bad configuration: %s. The server does not start; fix the value "
            "(or disable the extension: jupyter server extension disable jupyter_llm).",
            message,
        )
        raise SystemExit(1)

    def _share_log_config(self) -> None:
        """Our modules log through the server's handlers at its level, so
        ``--debug`` shows every line a runner writes to stderr."""
        package = logging.getLogger("jupyter_llm")
        package.setLevel(self.log.getEffectiveLevel())
        for handler in self.log.handlers or logging.getLogger(self.log.name).handlers:
            if handler not in package.handlers:
                package.addHandler(handler)
        package.propagate = not package.handlers

    def initialize_handlers(self) -> None:
        routes = handlers() if self.engine is None else forward.handlers(handlers())
        self.handlers.extend((f"/llm/{path}", handler) for path, handler in routes)

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Background work once the server's loop runs: the history sampler."""
        if self.services is not None:
            self.services.start()

    async def stop_extension(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, helper_process.stop)
        if self.engine is not None:
            await self.engine.close()
        if self.services is not None:
            await self.services.stop()
