"""A model whose answers outlast any test.

An answer runs at most 10 contexts of tokens (``predict_contexts``, whatever
``num_predict`` asks), so a request that must run until its test ends it
(held, cancelled, killed mid-stream) loads the demo model at 32k: its end,
327,680 tokens, lies far past any test, where the 2k demo model's comes at
20,480 tokens, seconds on a fast core.
"""

from __future__ import annotations

from pathlib import Path

from jupyter_llm.demo import DemoModelSpec, write_demo_model

ENDLESS_CONTEXT = 32768
# a num_predict no test reaches: the runner lowers it to 10 x ENDLESS_CONTEXT
FOREVER = 1_000_000


def write_endless_model(path: Path) -> Path:
    """The demo model, trained to ``ENDLESS_CONTEXT`` tokens."""
    return write_demo_model(path, DemoModelSpec(context_length=ENDLESS_CONTEXT))
