"""How many rows of logits the batch loop's context is made for.

llama.cpp sizes a context's worst-case graph, and the buffer its logits are
copied to, for ``n_outputs_max`` rows: a row per token of a batch unless told
fewer. The batch loop never asks for more than one row per sequence (the
token it samples next) plus one per drafted token being verified, so its
context is made for that many, not the whole batch: on Gemma 3 (a 262k
vocabulary, 1 MiB of logits a row) the compute buffer at the defaults falls
from 514.5 MiB to about 70 MiB: device memory on a GPU, and on the CPU what
the scheduler counts (pages the larger buffer never touched were not
resident). A draft model's context decodes one row per sequence at most
(``draft_rows``). The runner, the draft model's context and the memory
estimate all read the counts here, and the runner never fills a batch with
more rows than its context holds (``runner.engine``): llama.cpp aborts on a
decode that asks for more.

The logits' output buffer starts with a row per sequence id and grows (never
shrinks) to the most rows a decode asks for, cleared, so resident: the
estimate counts it at its largest, and the runner adds that growth to what
its load reports (``output_growth``).
"""

from __future__ import annotations

from jupyter_llm.request.limits import DRAFT_TOKENS


def output_rows(n_batch: int, n_seq: int, n_seq_max: int) -> int:
    """The most logit rows one step asks for: each of the ``n_seq``
    sequences decoded at once samples one token and verifies its longest
    draft, within the batch; at least one row per sequence id (llama.cpp
    keeps one for each of ``n_seq_max``, paused sequences' included)."""
    return max(n_seq_max, min(n_batch, n_seq * (1 + DRAFT_TOKENS.value)))


def draft_rows(n_seq_max: int) -> int:
    """A draft model's context: each decode holds a slot's catch-up (its
    last token's row) or one drafted token per drafting slot."""
    return n_seq_max


def output_growth(n_vocab: int, rows: int, n_seq_max: int) -> int:
    """Bytes the logits' output buffer grows by after the load: from a row
    per sequence id to ``rows`` (f32 logits over the vocabulary)."""
    return 4 * n_vocab * max(0, rows - n_seq_max)
