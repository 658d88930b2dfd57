"""The services the handlers share: one value built once by whatever hosts
the engine, the Jupyter extension (``app.py``) or the JupyterHub service
(``hub/service.py``), with its start (``build_services``) and stop.

They live apart from ``app.py`` so that the API layer can type what it
reaches through ``self.llm`` without importing the Jupyter extension.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from jupyter_llm.config import Settings, prompt_disk_dir
from jupyter_llm.devices import DeviceInfo, DeviceSource, device_from_raw
from jupyter_llm.history import HistorySampler
from jupyter_llm.models.pull import Puller
from jupyter_llm.models.store import ModelStore
from jupyter_llm.runner_client.device_probe import discover_raw_devices
from jupyter_llm.runner_client.launch import PromptDisk
from jupyter_llm.runner_client.proxy import start_serving_runner
from jupyter_llm.scheduler import Scheduler
from jupyter_llm.usage import UsageStore

log = logging.getLogger(__name__)


@dataclass
class LLMServices:
    """What the handlers reach through ``self.settings["jupyter_llm"]``."""

    settings: Settings
    store: ModelStore
    devices: DeviceSource
    scheduler: Scheduler
    puller: Puller
    usage: UsageStore = field(default_factory=UsageStore)  # %llm usage, /api/usage
    history: HistorySampler | None = None  # the sidebar's history (``start`` runs it)

    def start(self) -> None:
        """Start the background work, on the running loop: the history sampler."""
        if self.history is not None:
            self.history.start()

    async def stop(self) -> None:
        """Stop every runner, and a cluster's actors (the extension's and the
        Hub service's shutdown)."""
        try:
            if self.history is not None:
                await self.history.stop()
            await self.scheduler.shutdown()
        finally:
            self.scheduler.kill_all()
            await self.devices.close()

    def kill(self) -> None:
        """Last resort, synchronous (``atexit``): no runner outlives its engine."""
        self.scheduler.kill_all()


def build_services(settings: Settings) -> LLMServices:
    """The real thing: devices found by a discovery runner, models served by
    runner processes started with ``settings.python``; on a Ray cluster
    (``settings.ray_address``), both through actors on its nodes."""

    async def discover() -> list[DeviceInfo]:
        return [
            device_from_raw(raw) for raw in await discover_raw_devices(settings.python, strict=True)
        ]

    if settings.ray_address:  # the runners go to a Ray cluster's nodes
        from jupyter_llm.cluster import ray_services

        devices, start = ray_services(settings)
    else:
        devices = DeviceSource(discover, python=settings.python)
        disk = PromptDisk(
            str(prompt_disk_dir(settings)), settings.prompt_disk_cache, settings.prompt_disk_expiry
        )
        start = partial(
            start_serving_runner,
            python=settings.python,
            load_timeout=settings.load_timeout,
            prompt_disk=disk,
            prompt_ram=settings.prompt_ram_cache,
        )
    store = ModelStore(settings.models_dir)
    if removed := store.remove_stale_uploads():  # a directory listing, at startup
        log.info("removed %d unfinished uploads left in %s", removed, store.blobs_dir)
    scheduler = Scheduler(settings, start, devices)
    return LLMServices(
        settings=settings,
        store=store,
        devices=devices,
        scheduler=scheduler,
        history=HistorySampler(scheduler, devices, settings.history_interval),
        puller=Puller(
            store,
            hf_endpoint=settings.hf_endpoint,
            trusted_hosts=settings.trusted_auth_hosts,
        ),
    )
