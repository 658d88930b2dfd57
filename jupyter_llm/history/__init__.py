"""The sidebar's history: what the devices held, by model, and how fast tokens
came, over the last ten minutes. Sampled by the server (``sampler``), so a
browser reload loses nothing; kept in a bounded ring (``ring``)."""

from jupyter_llm.history.ring import Sample, downsample, history_body, top_models
from jupyter_llm.history.sampler import HistorySampler
from jupyter_llm.history.tokens import TOKENS, TokenTally

__all__ = [
    "TOKENS",
    "HistorySampler",
    "Sample",
    "TokenTally",
    "downsample",
    "history_body",
    "top_models",
]
