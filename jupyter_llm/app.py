"""The Jupyter server extension: builds the services once (``services.py``,
where ``LLMServices`` and ``build_services`` moved), mounts the handlers, and
kills every runner on shutdown."""

from __future__ import annotations

import atexit
import logging
from pathlib import Path

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int, Unicode

from jupyter_llm.api import handlers
from jupyter_llm.config import Settings
from jupyter_llm.services import LLMServices, build_services


class LLMExtension(ExtensionApp):
    """Local LLMs in the Jupyter server. Traits override JUPYTER_LLM_* env vars."""

    name = "jupyter_llm"
    load_other_extensions = True

    models_dir = Unicode(None, allow_none=True, config=True, help="Model store directory.")
    keep_alive = Float(None, allow_none=True, config=True, help="Seconds a model stays loaded.")
    context_length = Int(None, allow_none=True, config=True, help="Default num_ctx.")
    max_loaded_models = Int(None, allow_none=True, config=True, help="0: 3 x GPUs (min 3).")
    num_parallel = Int(None, allow_none=True, config=True, help="Parallel requests per model.")
    max_queue = Int(None, allow_none=True, config=True, help="Bound of the pending queue.")
    gpu_overhead = Int(None, allow_none=True, config=True, help="Bytes reserved per GPU.")
    new_estimates = Bool(None, allow_none=True, config=True, help="Use measured allocations.")
    load_timeout = Float(None, allow_none=True, config=True, help="Load stall timeout (s).")
    num_threads = Int(None, allow_none=True, config=True, help="CPU threads; 0: automatic.")
    stream_interval = Float(None, allow_none=True, config=True, help="Token grouping (s).")

    services: LLMServices

    def initialize_settings(self) -> None:
        overrides = {
            name: getattr(self, name)
            for name in (
                "keep_alive",
                "context_length",
                "max_loaded_models",
                "num_parallel",
                "max_queue",
                "gpu_overhead",
                "new_estimates",
                "load_timeout",
                "stream_interval",
                "num_threads",
            )
        }
        if self.models_dir:
            overrides["models_dir"] = Path(self.models_dir)
        settings = Settings.from_env(**overrides)
        self.services = build_services(settings)
        self.settings.update({"jupyter_llm": self.services})
        atexit.register(self.services.scheduler.kill_all)
        self._share_log_config()
        self.log.info("jupyter-llm: models in %s", settings.models_dir)

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
        self.handlers.extend((f"/llm/{path}", handler) for path, handler in handlers())

    async def stop_extension(self) -> None:
        try:
            await self.services.scheduler.shutdown()
        finally:
            self.services.scheduler.kill_all()
