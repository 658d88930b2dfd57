"""The vocabulary's trie (``grammar_trie``) finds exactly the tokens that
llama.cpp's grammar allows over the whole vocabulary, at every state of a
schema's grammar on the real Gemma vocabulary (262k tokens, byte tokens,
special tokens), including a state waiting mid-character."""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from cores import cores

from jupyter_llm.api.structured import parse_format
from jupyter_llm.runner.constrained import Candidates
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.grammar_trie import TokenTrie, matches_text
from jupyter_llm.runner.protocol import LoadParams

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", "déf"]}, "maxItems": 2},
    },
    "required": ["title", "year", "tags"],
}


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path):
    engine = Engine(LoadParams(path=str(gemma_gguf), n_ctx=256, n_threads=cores(), n_seq=1))
    yield engine
    engine.close()


def test_the_trie_is_built_when_a_grammar_first_asks_for_it(gemma):
    """A load does not build it (a second of a core, for models that may
    never meet a grammar); the first ask starts the build and is answered
    by the full pass meanwhile; a later ask gets it."""
    tokens = gemma.model.tokens
    assert tokens._trie is None and tokens._building is None  # the load alone built nothing
    assert tokens.ready_trie() is None  # not waited for: the full pass answers this one
    tokens.join()
    assert isinstance(tokens.ready_trie(), TokenTrie)


def test_the_trie_allows_what_the_full_pass_allows_at_every_state(gemma):
    model = gemma.model
    trie = model.tokens.trie()
    check = Candidates(model.n_vocab)
    everything = np.arange(model.n_vocab, dtype=np.int32)
    grammar = llama_cpp.llama_sampler_init_grammar(
        model.vocab, parse_format(SCHEMA).grammar.encode(), b"root"
    )
    doc = {"title": 'Été à 東京, 42 "quoted" \\ done', "year": -1999, "tags": ["déf", "a"]}
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    byte = {model.piece(t, True): t for t in range(model.n_vocab) if len(model.piece(t, True)) == 1}
    before, after = text.split("東")

    def tokenize(part: str) -> list[int]:
        return model.tokenize(part.encode(), add_special=False, parse_special=False)

    # 東 as its three byte tokens: the grammar waits mid-character twice
    tokens = [*tokenize(before), *(byte[bytes([b])] for b in "東".encode()), *tokenize(after)]
    sizes = []
    try:
        for token in [*tokens, None]:
            full = np.flatnonzero(check.allows_many(grammar, everything))
            found = np.sort(trie.allowed(lambda ids: check.allows_many(grammar, ids)))
            np.testing.assert_array_equal(found, full)
            sizes.append(len(full))
            if token is None:
                break
            assert token in full  # the document is the schema's
            llama_cpp.llama_sampler_accept(grammar, token)
    finally:
        llama_cpp.llama_sampler_free(grammar)
    assert min(sizes) <= 3 and max(sizes) > model.n_vocab // 2  # narrow and wide states
    assert set(trie.eog.tolist()) <= set(full.tolist())  # the end: end-of-generation allowed


def test_the_trie_checks_children_of_allowed_tokens_only():
    pieces = [b"a", b"ab", b"abc", b"b", b"\xe4", b"", b"x\0y", b"bc", b"abd", b"</s>"]
    pieces += ["一".encode(), b"\xc0", "\u00c0x".encode()]
    trie = TokenTrie.build(pieces, {9})
    assert sorted(trie.roots.tolist()) == [0, 3, 4, 5, 6, 11, 12]  # unclean tokens are roots
    assert trie.children_of(np.array([4])).tolist() == [10]  # 一 under its lead byte 0xE4
    checked: list[int] = []

    def check(ids):
        checked.extend(ids.tolist())
        return np.isin(ids, [0, 1, 3, 9])

    assert sorted(trie.allowed(check).tolist()) == [0, 1, 3, 9]
    assert sorted(checked) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]  # "abc"/"abd" after "ab"
    checked.clear()
    assert trie.allowed(lambda ids: np.isin(ids, [1, 2])).tolist() == []
    assert 2 not in checked  # "abc" is not checked when "a" was refused


def test_a_trie_pass_over_its_budget_gives_way():
    """With a budget, a pass that would check more tokens than it stops
    before the level that crosses it (None: the caller walks deeper ranks
    instead); within it, the same set as without."""
    pieces = [b"a", b"ab", b"abc", b"abd", b"b", b"bc", b"x"]
    trie = TokenTrie.build(pieces, set())
    calls: list[list[int]] = []

    def check(ids):
        calls.append(sorted(ids.tolist()))
        return np.isin(ids, (0, 1, 2, 4, 5))

    everything = sorted(trie.allowed(check).tolist())
    assert everything == [0, 1, 2, 4, 5]
    checked = sum(len(c) for c in calls)  # roots a, b, x; then ab, bc; then abc, abd
    assert checked == 7
    calls.clear()
    assert sorted(trie.allowed(check, budget=checked).tolist()) == everything
    calls.clear()
    assert trie.allowed(check, budget=checked - 1) is None
    assert sum(len(c) for c in calls) == 5  # the last level was not checked


def test_grammars_with_token_references_are_not_read_as_texts():
    assert matches_text('root ::= "<a>" [<!] "!" # <x> in a comment\nx ::= "\\"<"')
    assert not matches_text('root ::= <[12]> "a"')
    assert not matches_text('root ::= "a" !<|end|>')
    assert matches_text(parse_format(SCHEMA).grammar)
