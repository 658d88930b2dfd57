"""The grammar's fast path (issue 26, item 3): the chain's own pick is
checked first and the grammar runs over every candidate only when that pick
is refused. Greedy output must be the full path's, token for token."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from jupyter_llm.api.structured import parse_format
from jupyter_llm.runner import constrained
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from tests.runner.test_constrained import GREEDY, generate

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "score": {"type": "integer"},
    },
    "required": ["title", "tags", "score"],
}


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path):
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=1024, n_threads=2, n_seq=1))
    yield engine
    engine.close()


def run(gemma: Engine, monkeypatch: pytest.MonkeyPatch, check_first: bool) -> tuple[str, list, int]:
    """Text, tokens and how many times the grammar went over every candidate."""
    passes = []
    full = constrained.GrammarSampler._constrained

    def counted(self, ctx, index):
        passes.append(index)
        return full(self, ctx, index)

    monkeypatch.setattr(constrained, "CHECK_SAMPLED_FIRST", check_first)
    monkeypatch.setattr(constrained.GrammarSampler, "_constrained", counted)
    prompt = "Describe a film as JSON."
    text, done = generate(
        gemma,
        prompt,
        options={**GREEDY, "num_predict": 96},
        grammar=parse_format(SCHEMA).grammar,
    )
    monkeypatch.undo()
    return text, done.context[len(gemma.model.prompt_tokens(prompt)) :], len(passes)


def test_greedy_output_with_the_fast_path_is_the_full_paths(gemma, monkeypatch):
    slow_text, slow_tokens, slow_passes = run(gemma, monkeypatch, check_first=False)
    fast_text, fast_tokens, fast_passes = run(gemma, monkeypatch, check_first=True)
    assert fast_tokens == slow_tokens
    assert fast_text == slow_text
    assert slow_passes >= len(slow_tokens)  # the full path: a pass per token (and the end)
    assert fast_passes < slow_passes  # most of the chain's picks were allowed as they came
    if slow_text.rstrip().endswith("}"):
        import json

        jsonschema.validate(json.loads(slow_text), SCHEMA)
