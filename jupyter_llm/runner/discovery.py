"""Device discovery through a short-lived runner (no model loaded)."""

from __future__ import annotations

import logging
from typing import Any

from jupyter_llm.errors import RunnerFailed
from jupyter_llm.runner.process import RunnerProcess

log = logging.getLogger(__name__)


async def discover_raw_devices(
    python: str = "", env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The ggml devices a runner sees; [] (CPU only) when the runner fails, so a
    broken GPU backend costs the GPU, not the server."""
    process = RunnerProcess(python=python, env=env, label="discovery runner")
    try:
        await process.start()
        reply = await process.call("info")
        return list(reply.get("devices", []))
    except RunnerFailed as e:
        log.warning("device discovery failed, using the CPU only: %s", e)
        return []
    finally:
        await process.close(timeout=5.0)
