"""jupyter-llm: local LLMs as a Jupyter service (Ollama- and OpenAI-compatible)."""

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from jupyter_llm.app import LLMExtension

    return [{"module": "jupyter_llm.app", "app": LLMExtension}]


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext jupyter_llm``: the ``%%llm`` and ``%llm`` magics."""
    from jupyter_llm.kernel.magics import LLMMagics

    magics = LLMMagics(shell=ipython)
    ipython.register_magics(magics)  # type: ignore[attr-defined]
    ipython.configurables.append(magics)  # type: ignore[attr-defined]  # for %config


def client() -> object:
    """The official ``ollama.Client``, pointed at this notebook's server."""
    from jupyter_llm.connect import find_server

    return find_server().ollama_client()


def openai_client() -> object:
    """The official ``openai.OpenAI`` client, pointed at this notebook's server."""
    from jupyter_llm.connect import find_server

    return find_server().openai_client()


def __getattr__(name: str) -> object:
    """``jupyter_llm.map`` (``kernel.batch.map_prompts``), imported on first use:
    a list or pandas Series of prompts through one model, as many at once as
    it has slots, with a progress bar; results in input order."""
    if name == "map":
        from jupyter_llm.kernel.batch import map_prompts

        return map_prompts
    if name in ("image_base64", "image_url"):
        # a PIL image, matplotlib figure, image bytes or path for the official
        # clients: ollama's ``images=[...]``, OpenAI's ``image_url`` part
        from jupyter_llm.kernel import image_inputs

        return getattr(image_inputs, name)
    raise AttributeError(f"module 'jupyter_llm' has no attribute {name!r}")
