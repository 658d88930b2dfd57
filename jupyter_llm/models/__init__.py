"""The model store: names, Ollama's on-disk layout, GGUF metadata."""

from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.models.store import ModelEntry, ModelStore

__all__ = ["ModelEntry", "ModelName", "ModelStore", "parse_model_name"]
