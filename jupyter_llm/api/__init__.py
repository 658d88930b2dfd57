"""HTTP API under ``{base_url}llm/``: Ollama-compatible (``api/``) and
OpenAI-compatible (``v1/``) handlers."""

from jupyter_llm.api import ollama, openai


def handlers() -> list[tuple[str, type]]:
    """Every route, relative to ``{base_url}llm/``: the one list the app mounts."""
    return [*ollama.handlers(), *openai.handlers()]


__all__ = ["handlers"]
