"""The grammar's fast path (issue 26, item 3): the chain's own pick is
checked first and the grammar runs over every candidate only when that pick
is refused. Greedy output must be the full path's, token for token."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from cores import cores

from jupyter_llm import demo
from jupyter_llm.api.structured import parse_format
from jupyter_llm.runner import constrained, grammar_walk
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
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=1024, n_threads=cores(), n_seq=1))
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


# A schema that the model's free picks break often: digits and short enums.
REFUSING = {
    "type": "object",
    "properties": {
        "year": {"type": "integer", "minimum": 1000},
        "rating": {"enum": ["G", "PG", "R"]},
        "cast": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 4},
    },
    "required": ["year", "rating", "cast"],
}


def walked_run(engine: Engine, walk: bool, options: dict) -> tuple[list, int, int]:
    """Tokens, refusals resolved by the walk, and full passes taken."""
    walks, passes = [], []
    walked, full = constrained.GrammarSampler._walked, constrained.GrammarSampler._constrained

    def counted_walk(self, ctx, index):
        token = walked(self, ctx, index) if walk else None
        if token is not None:
            walks.append(token)
        return token

    def counted_full(self, ctx, index):
        passes.append(index)
        return full(self, ctx, index)

    with pytest.MonkeyPatch.context() as patch:  # the caller's own patches stay
        patch.setattr(constrained.GrammarSampler, "_walked", counted_walk)
        patch.setattr(constrained.GrammarSampler, "_constrained", counted_full)
        prompt = "Describe a film as JSON."
        grammar = parse_format(REFUSING).grammar
        _, done = generate(engine, prompt, options=options, grammar=grammar)
    return done.context[len(engine.model.prompt_tokens(prompt)) :], len(walks), len(passes)


@pytest.mark.parametrize(
    "options",
    [
        {**GREEDY, "num_predict": 80},
        {**GREEDY, "num_predict": 80, "repeat_penalty": 1.3},
        {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 7, "num_predict": 80},
        {"temperature": 1.2, "top_k": 5, "min_p": 0.05, "seed": 3, "num_predict": 80},
    ],
)
def test_the_walk_picks_the_full_passs_token_on_gemma(gemma, options):
    full_tokens, _, full_passes = walked_run(gemma, False, options)
    walk_tokens, walks, passes = walked_run(gemma, True, options)
    assert walk_tokens == full_tokens
    assert full_passes > 0  # the schema did refuse picks
    assert walks > 0 and passes < full_passes  # and the walk settled them


@pytest.mark.parametrize(
    "options",
    [
        {**GREEDY, "num_predict": 80},
        {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 7, "num_predict": 80},
    ],
)
def test_with_the_trie_built_the_walk_still_picks_the_full_passs_token(gemma, options):
    """The trie is built on a grammar's first ask (in a thread): once it is,
    a walk that gives up takes the best of the trie's allowed set."""
    tokens = gemma.model.tokens
    tokens.ready_trie()
    tokens.join()
    assert tokens.ready_trie() is not None
    full_tokens, _, full_passes = walked_run(gemma, False, options)
    walk_tokens, walks, passes = walked_run(gemma, True, options)
    assert walk_tokens == full_tokens
    assert walks > 0 and passes < full_passes


def test_the_walk_on_a_generated_model(tmp_path, monkeypatch):
    monkeypatch.setattr(grammar_walk, "WALK_FROM_VOCAB", 0)  # its vocabulary is small
    path = tmp_path / "tiny.gguf"
    demo.write_demo_model(path)
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_threads=cores(), n_seq=1))
    try:
        for options in (
            {**GREEDY, "num_predict": 60},
            {"temperature": 1.0, "top_k": 8, "seed": 5, "num_predict": 60},
        ):
            full_tokens, _, full_passes = walked_run(engine, False, options)
            walk_tokens, walks, _ = walked_run(engine, True, options)
            assert walk_tokens == full_tokens
            assert full_passes > 0 and walks > 0
    finally:
        engine.close()
