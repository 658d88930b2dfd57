"""A prompt or chat far longer than the context costs the runner's loop what
the context can hold, not what was sent: a 6.5 MiB chat was rendered and
tokenized 14 times on the loop every stream waits on (61 s), and a 32 MiB
prompt was tokenized whole before truncation kept a few thousand tokens."""

from __future__ import annotations

import pytest

from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import InputError, LoadParams

N_CTX = 256


@pytest.fixture(scope="module")
def engine(demo_gguf):
    engine = Engine(LoadParams(path=str(demo_gguf), n_ctx=N_CTX, n_threads=1, n_seq=1))
    yield engine
    engine.close()


def words(n: int) -> str:
    return " ".join(f"w{i % 977}" for i in range(n))


def test_a_prompt_far_past_the_context_is_cut_before_it_is_tokenized(engine):
    prompt = words(300_000)  # 1.8 MB
    whole = engine.model.prompt_tokens(prompt)
    cut = engine.prompt_tokens(prompt, None, None, truncate=True)
    assert len(cut) < len(whole) / 10
    for keep in (0, 4, N_CTX - 2):  # truncation keeps the same head and end
        assert engine.fit_prompt(cut, keep, True) == engine.fit_prompt(whole, keep, True)
    with pytest.raises(InputError, match="does not fit the context length"):
        engine.prompt_tokens(prompt, None, None, truncate=False)
    short = words(50)
    assert engine.prompt_tokens(short, None, None, True) == engine.model.prompt_tokens(short)


def test_a_text_surely_too_long_is_judged_without_tokenizing(engine, monkeypatch):
    tokenized: list[int] = []
    tokenize = engine.model.tokenize
    monkeypatch.setattr(
        engine.model,
        "tokenize",
        lambda text, **kw: tokenized.append(len(text)) or tokenize(text, **kw),
    )
    assert not engine.fits(words(300_000))
    assert tokenized == []
    assert engine.fits(words(10)) and tokenized
