"""jupyter-llm: local LLMs as a Jupyter service (Ollama- and OpenAI-compatible)."""

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from jupyter_llm.app import LLMExtension

    return [{"module": "jupyter_llm.app", "app": LLMExtension}]
