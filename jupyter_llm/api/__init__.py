"""HTTP API: Ollama-compatible handlers under ``{base_url}llm/``."""

from jupyter_llm.api.ollama import handlers

__all__ = ["handlers"]
