"""Client side: finding the engine (a Jupyter server with jupyter-llm, or an
embedded one), and, in a kernel, the magics and widgets."""

from jupyter_llm.kernel.connection import Engine, LLMClientError, find_engine

__all__ = ["Engine", "LLMClientError", "find_engine"]
