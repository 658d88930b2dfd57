"""A generative model embeds by its last token's row alone (``last_rows``):
on the real Gemma 3 270M (a 262k vocabulary) llama.cpp's own pooled context
ran the output layer over every token, 1 MiB of logits each (a 512-token
piece held 1 GiB more in the runner) and 2.2x the time. The vectors are
llama.cpp's own last-token pooling, for inputs in one chunk and for an input
decoded in pieces; the runner's memory does not grow by the logits."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import psutil
import pytest
from cores import cores
from engine_embed import embed
from vectors import cosine

from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams

LONG = " ".join(f"word{i}" for i in range(160))  # 580 tokens: two pieces of 512
TEXTS = ["a", "the cat sat on the mat", LONG]
MiB = 1 << 20


def pooled_by_llama_cpp(path: Path, texts: list[str]) -> list[list[float]]:
    """llama.cpp's own last-token pooling, each input whole in one batch."""
    model = llama_cpp.Llama(
        str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST,
        n_ctx=2048, n_batch=2048, n_ubatch=2048, n_threads=cores(), verbose=False,
    )  # fmt: skip
    try:
        return [model.embed(text, normalize=False) for text in texts]
    finally:
        model.close()


@pytest.mark.timeout(300)
def test_gemma_embeds_by_its_last_rows_as_llama_cpp_pools(gemma_gguf: Path) -> None:
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=2048, n_seq=1, n_threads=cores()))
    try:
        process = psutil.Process()
        before = process.memory_info().rss
        alone = [embed(engine, [text])[0] for text in TEXTS]
        grew = process.memory_info().rss - before
        assert engine.embeddings._last_rows is not None
        together = embed(engine, TEXTS)  # one chunk: a row for each input, in order
    finally:
        engine.close()
    # the pooled context's logits alone were 512 rows of 262,144 floats, twice
    assert grew < 256 * MiB, f"the runner grew {grew / MiB:.0f} MiB"
    expected = pooled_by_llama_cpp(gemma_gguf, TEXTS)
    for text, a, b in zip(TEXTS, alone, expected, strict=True):
        assert len(a) == len(b) == 640
        scale = max(abs(x) for x in b)
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4 * scale, text[:20]
    # several inputs in one decode take llama.cpp's batched kernels (their last
    # bits differ, and Gemma's activations grow that to a cosine of 0.999)
    for i, vector in enumerate(together):
        near = [cosine(vector, other) for other in alone]
        assert near[i] > 0.998 and near[i] == max(near), (TEXTS[i][:20], near)


def test_a_graph_without_the_named_norm_keeps_llama_cpps_pooling(tmp_path, monkeypatch) -> None:
    """Not every architecture's graph names its final norm ``result_norm``: the
    probe's decode finds no row there, and llama.cpp pools as before."""
    from jupyter_llm.demo import DemoModelSpec, write_demo_model
    from jupyter_llm.runner import last_rows

    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    texts = ["hello there", "the cat sat on the mat"]
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_seq=1, n_threads=1))
    try:
        by_rows = [embed(engine, [text])[0] for text in texts]
        assert engine.embeddings._last_rows is not None
    finally:
        engine.close()
    monkeypatch.setattr(last_rows, "NORM", b"no such tensor")
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_seq=1, n_threads=1))
    try:
        pooled = [embed(engine, [text])[0] for text in texts]
        assert engine.embeddings._last_rows is None
    finally:
        engine.close()
    for a, b in zip(by_rows, pooled, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5 * max(map(abs, b))


def test_a_recurrent_model_keeps_each_vector_with_its_input(tmp_path) -> None:
    """A recurrent memory splits a chunk into equal-length ubatches, so a short
    input's row is computed before a long one's: read from the graph, the
    vectors came back swapped. Such models keep llama.cpp's pooling, which
    puts the rows back in order."""
    from mamba_gguf import write_mamba

    path = write_mamba(tmp_path / "mamba.gguf")
    texts = ["the cat sat on the mat and then it went away", "hi"]
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_seq=1, n_threads=1))
    try:
        alone = [embed(engine, [text])[0] for text in texts]
        together = embed(engine, texts)
        reads_rows = engine.embeddings._last_rows is not None
    finally:
        engine.close()
    for i, vector in enumerate(together):
        far = [max(abs(x - y) for x, y in zip(vector, other, strict=True)) for other in alone]
        assert far[i] < 1e-4 < far[1 - i], (i, far)
    assert not reads_rows
