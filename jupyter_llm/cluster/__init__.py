"""Runners across a Ray cluster (``pip install jupyter-llm[ray]``).

With ``JUPYTER_LLM_RAY_ADDRESS`` (the ``ray_address`` setting) set, the
scheduler's device source and runner factory come from here: each serving
node reports its devices through a discovery actor, and each model is served
by an actor pinned to the node the scheduler chose. The scheduler's policy is
the local one; it places a model on one node's devices.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from jupyter_llm.config import Settings
from jupyter_llm.request.errors import ConfigError

if TYPE_CHECKING:
    from jupyter_llm.cluster.source import RayDeviceSource
    from jupyter_llm.scheduler import RunnerFactory


def ray_services(settings: Settings) -> tuple[RayDeviceSource, RunnerFactory]:
    """The device source and runner factory for ``settings.ray_address``."""
    try:
        from jupyter_llm.cluster.ray_cluster import RayCluster
        from jupyter_llm.cluster.runner import start_ray_runner
        from jupyter_llm.cluster.source import RayDeviceSource
    except ImportError as e:
        raise ConfigError(
            f"JUPYTER_LLM_RAY_ADDRESS is set but Ray is not installed ({e}): "
            "pip install 'jupyter-llm[ray]'"
        ) from None
    cluster = RayCluster(settings.ray_address)
    source = RayDeviceSource(cluster, python=settings.python)
    start = partial(start_ray_runner, cluster=cluster, load_timeout=settings.load_timeout)
    return source, start
