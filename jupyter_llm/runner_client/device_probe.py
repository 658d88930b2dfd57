"""Device discovery through a short-lived runner (no model loaded)."""

from __future__ import annotations

import logging
from typing import Any

from jupyter_llm.request.errors import RunnerFailed
from jupyter_llm.runner_client.process import RunnerProcess

log = logging.getLogger(__name__)


class DiscoveryFailed(Exception):
    """The discovery runner could not list devices; the message says why."""


async def discover_raw_devices(
    python: str = "", env: dict[str, str] | None = None, *, strict: bool = False
) -> list[dict[str, Any]]:
    """The ggml devices a runner sees; [] (CPU only) when the runner fails, so a
    broken GPU backend or interpreter costs the GPU, not the server. ``strict``
    raises ``DiscoveryFailed`` instead, so callers can show why."""
    process = RunnerProcess(python=python, env=env, label="discovery runner")
    try:
        await process.start()
        reply = await process.call("info")
        return list(reply.get("devices", []))
    except RunnerFailed as e:
        log.warning(
            "device discovery with the runner interpreter %s failed, using the CPU only: %s",
            process.python,
            e,
        )
        if strict:
            raise DiscoveryFailed(str(e)) from e
        return []
    finally:
        await process.close(timeout=5.0)
