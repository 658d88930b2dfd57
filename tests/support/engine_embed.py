"""An embed request run to its end on an in-process engine (no runner
process): the embeddings' turns taken one after another."""

from __future__ import annotations

import json

from jupyter_llm.runner.embedding import EmbedJob
from jupyter_llm.runner.engine import Engine


def embed(engine: Engine, texts: list[str], normalize: bool = False) -> list[list[float]]:
    vectors: list[str] = []
    done: list[int] = []
    failed: list[Exception] = []
    job = EmbedJob(
        rid=1, texts=texts, truncate=True, dimensions=None, normalize=normalize,
        encoding="float", emit=vectors.extend, finish=done.append, fail=failed.append,
    )  # fmt: skip
    engine.embeddings.submit(job)
    while not (done or failed):
        assert engine.embeddings.turn(None, streams=False)
    if failed:
        raise failed[0]
    return [json.loads(v) for v in vectors]
