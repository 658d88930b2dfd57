"""Runner processes: the wire protocol, the process itself, and ``RunnerProcess``,
the one place that spawns one (for discovery and for serving)."""

from jupyter_llm.runner.process import RunnerProcess

__all__ = ["RunnerProcess"]
