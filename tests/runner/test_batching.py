"""The batched engine on a generated model: several sequences per decode,
per-slot prefix caches, context shift and truncation. Engine tests run in
process and count decode steps, never time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cores import cores
from runner_streams import text_and_done

from jupyter_llm.request.limits import PREDICT_CONTEXTS
from jupyter_llm.runner.chat_plan import chat_prompt
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import Complete, Done, InputError, LoadParams
from jupyter_llm.runner.sequence import Job
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.proxy import start_runner_with

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
# a grammar that never completes: only a cancel or num_predict ends the answer
ENDLESS = 'root ::= "a" root'


class Run:
    """One submitted job and what came back."""

    def __init__(self, engine: Engine, prompt: str, **options: Any) -> None:
        self.text: list[str] = []
        self.done: Done | None = None
        self.error: Exception | None = None
        self.cancel = False
        grammar = options.pop("grammar", None)
        shift = options.pop("shift", True)
        priority = options.pop("priority", "interactive")
        self.job = Job(
            rid=id(self),
            tokens=engine.fit_prompt(engine.model.prompt_tokens(prompt), 4, truncate=True),
            options={**GREEDY, **options},
            emit=self.text.append,
            finish=self._finish,
            fail=self._fail,
            cancelled=lambda: self.cancel,
            grammar=grammar,
            shift=shift,
            priority=priority,
        )
        engine.submit(self.job)

    def _finish(self, c: Done) -> None:
        self.done = c

    def _fail(self, e: Exception) -> None:
        self.error = e

    @property
    def output(self) -> str:
        return "".join(self.text)


def drain(engine: Engine, limit: int = 10_000) -> int:
    steps = 0
    while engine.busy:
        engine.step()
        steps += 1
        assert steps < limit
    return steps


def test_batched_sequences_give_each_its_own_answer(engine):
    alone = Run(engine, "hello world", num_predict=24)
    drain(engine)
    runs = [
        Run(engine, "hello world", num_predict=24),
        Run(engine, "the quick brown fox", num_predict=24, seed=3, temperature=1.2),
        Run(engine, "once upon a time", num_predict=12, stop=["zz"]),
    ]
    steps = drain(engine)
    assert runs[0].output == alone.output  # batching does not change an answer
    assert [r.done.eval_count for r in runs] == [24, 24, 12]
    # one decode per step for all three: about 24 steps, not 24 + 24 + 12
    assert steps <= 24 + 2


def test_each_sequence_has_its_own_sampler_and_grammar(engine):
    constrained = Run(engine, "abc", num_predict=10, grammar='root ::= [0-9]+ "."')
    free = Run(engine, "abc", num_predict=10)
    drain(engine)
    assert constrained.output and set(constrained.output) <= set("0123456789.")
    assert free.done.eval_count == 10 and not set(free.output) <= set("0123456789.")


def test_a_finished_sequence_frees_its_slot_for_the_next_request(engine):
    short = [Run(engine, f"short {i}", num_predict=2) for i in range(3)]
    queued = Run(engine, "queued", num_predict=2)
    assert queued.job.rid in engine.active_ids and engine.waiting  # three slots: it waits
    steps = 0
    while not all(r.done for r in short):
        engine.step()
        steps += 1
    assert not engine.waiting  # it took a freed slot
    drain(engine)
    assert queued.done.eval_count == 2


def test_a_long_prompt_delays_streams_by_one_chunk_at_most(engine):
    streaming = Run(engine, "stream", grammar=ENDLESS, num_predict=400)
    engine.step()  # its prompt
    engine.step()
    before = len(streaming.text)
    long = Run(engine, "x " * 200, num_predict=1)  # about 15 chunks of the batch
    steps = 0
    while long.done is None:
        engine.step()
        steps += 1
    assert steps > 5  # it really came in chunks...
    assert len(streaming.text) - before >= steps - 1  # ...and the stream got a token each step
    streaming.cancel = True
    drain(engine)
    assert streaming.done.done_reason == "cancel"


def test_a_chat_turn_goes_to_the_slot_holding_its_conversation(engine):
    first = Run(engine, "system: be brief\nuser: hi\nassistant:", num_predict=8)
    drain(engine)
    history = list(first.job.tokens)
    slot = next(s for s in engine.slots if s.cached[: len(history)] == history)
    others = [Run(engine, f"unrelated request {i}", num_predict=4) for i in range(2)]
    drain(engine)
    assert slot.cached[: len(history)] == history  # the others went to other slots
    turn = "system: be brief\nuser: hi\nassistant:" + first.output + "\nuser: more\nassistant:"
    second = Run(engine, turn, num_predict=4)
    seq = engine.slots[slot.index].seq  # assigned on submit
    assert seq is not None and seq.job is second.job and seq.fed > len(history) // 2
    drain(engine)
    assert second.done.eval_count == 4 and all(o.done for o in others)


def test_generation_runs_past_the_context_by_shifting(tmp_path):
    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    small = Engine(LoadParams(path=str(path), n_ctx=64, n_batch=16, n_threads=cores(), n_seq=2))
    try:
        past = 2 * small.n_ctx + 10  # llama.cpp pads n_ctx (to 256 here)
        long = Run(small, "go", grammar=ENDLESS, num_predict=past)
        drain(small)
        assert (long.done.done_reason, long.done.eval_count) == ("length", past)
        assert long.output == "a" * len(long.output) and len(long.output) >= past
        stopped = Run(small, "go", grammar=ENDLESS, num_predict=past, shift=False)
        drain(small)
        assert stopped.done.done_reason == "length" and stopped.done.eval_count < small.n_ctx
        fill = Run(small, "go", grammar=ENDLESS, num_predict=-2)  # Ollama: fill the context
        drain(small)
        assert fill.done.done_reason == "length" and fill.done.eval_count < small.n_ctx
        # at most predict_contexts contexts (Ollama's 10), asked as -1 or as a larger count
        longest = PREDICT_CONTEXTS.value * small.n_ctx
        for asked, limit in ((-1, longest), (longest + 1, longest), (longest - 1, longest - 1)):
            endless = Run(small, "go", grammar=ENDLESS, num_predict=asked)
            seqs = [s.seq for s in small.slots if s.seq] + list(small.waiting)
            assert [q.limit for q in seqs if q.job is endless.job] == [limit]
            endless.cancel = True
            drain(small)
            assert endless.done.done_reason == "cancel"
        capped = Run(small, "go", grammar=ENDLESS, num_predict=10**9)
        drain(small)
        assert (capped.done.done_reason, capped.done.eval_count) == ("length", longest)
    finally:
        small.close()


def test_an_over_long_prompt_is_cut_or_refused(engine):
    tokens = list(range(10, 10 + 600))
    cut = engine.fit_prompt(tokens, num_keep=4, truncate=True)
    assert len(cut) == engine.n_ctx - 1 and cut[:4] == tokens[:4] and cut[-1] == tokens[-1]
    with pytest.raises(InputError, match="does not fit the context length"):
        engine.fit_prompt(tokens, num_keep=4, truncate=False)


def test_a_long_chat_keeps_its_system_prompt_and_latest_message(engine):
    chat = [{"role": "system", "content": "SYSTEM-RULES"}]
    for i in range(40):
        chat += [
            {"role": "user", "content": f"question {i} " + "words " * 10},
            {"role": "assistant", "content": f"answer {i} " + "words " * 10},
        ]
    chat.append({"role": "user", "content": "LATEST-QUESTION"})
    prompt = chat_prompt(engine, chat, None, truncate=True)
    assert "SYSTEM-RULES" in prompt and "LATEST-QUESTION" in prompt
    assert "question 0 " not in prompt and "answer 39 " in prompt  # oldest dropped first
    assert len(engine.model.tokenize(prompt)) < engine.n_ctx
    whole = chat_prompt(engine, chat, None, truncate=False)
    assert "question 0 " in whole


# -- through a runner process ------------------------------------------------------------


async def test_a_runner_serves_requests_while_another_streams(demo_gguf: Path):
    spec = LoadSpec(path=str(demo_gguf), n_ctx=1024, n_batch=64, n_seq=2)
    runner = await start_runner_with(spec, load_timeout=60)
    try:
        assert runner.n_seq == 2
        endless = runner.complete(Complete(prompt="go", options=GREEDY, grammar=ENDLESS))
        first = await anext(endless)  # it streams, and cannot end by itself
        assert first
        # served at once beside it (a runner serving one at a time would hang here)
        _, done = await asyncio.wait_for(
            text_and_done(
                runner.complete(Complete(prompt="hi", options={**GREEDY, "num_predict": 3}))
            ),
            60,
        )
        assert done["eval_count"] == 3
        await endless.aclose()  # the client leaves: the runner cancels the sequence
        _, done = await asyncio.wait_for(
            text_and_done(
                runner.complete(Complete(prompt="hi", options={**GREEDY, "num_predict": 3}))
            ),
            60,
        )
        assert done["eval_count"] == 3
    finally:
        await runner.close()


def test_an_empty_prompt_begins_with_the_models_first_token(engine, monkeypatch):
    """An empty prompt is decoded as the model's BOS token. A vocabulary with
    none (RWKV's, T5's) gave -1, and llama.cpp refused the whole step: every
    sequence in it failed. Now the request alone is refused."""
    import llama_cpp

    bos = llama_cpp.llama_vocab_bos(engine.model.vocab)
    assert engine.model.prompt_tokens("") == [bos] and bos >= 0
    monkeypatch.setattr(llama_cpp, "llama_vocab_bos", lambda vocab: -1)
    with pytest.raises(InputError, match="the prompt is empty"):
        engine.model.prompt_tokens("")


def test_a_prompt_waits_for_room_another_request_holds(tmp_path):
    """The cache is shared: a long answer that fills it left the next
    user's prompt no room, and when it ended (no shift allowed) its cells
    stayed as an idle cache while the prompt failed with "the context is
    full" (a 500 for another user). The idle cache now goes, and the prompt
    runs."""
    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec())
    small = Engine(LoadParams(path=str(path), n_ctx=64, n_batch=16, n_threads=cores(), n_seq=2))
    try:
        filler = Run(small, "go", grammar=ENDLESS, num_predict=10**6, shift=False)
        while len(filler.text) < small.n_ctx - 60:
            small.step()
        late = Run(small, "hello world " * 9, num_predict=4)  # about 100 tokens: no room
        drain(small)
        assert filler.done.done_reason == "length"
        assert late.error is None and late.done.eval_count == 4
    finally:
        small.close()


@pytest.mark.parametrize("temperature", [1e-45, 1e-38])
def test_a_vanishing_temperature_samples_as_greedy(engine, temperature):
    """Logits divided by 1e-45 overflowed float32: NaN probabilities, junk
    text, and with a format "the sampler left no token to choose" (a 500)."""
    greedy = Run(engine, "hello world", num_predict=12, temperature=0)
    drain(engine)
    tiny = Run(engine, "hello world", num_predict=12, temperature=temperature, grammar=ENDLESS)
    tiny_free = Run(engine, "hello world", num_predict=12, temperature=temperature)
    drain(engine)
    assert tiny.error is None and tiny.output == "a" * 12
    assert tiny_free.error is None and tiny_free.output == greedy.output


def test_a_grammar_llama_cpp_refuses_is_the_requests_error(engine):
    """Every grammar comes from the request (its format, schema or tools):
    one llama.cpp's parser refuses is a 400, and the runner goes on."""
    with pytest.raises(InputError, match=r"llama\.cpp refused the grammar"):
        Run(engine, "hi", grammar="root ::= (", num_predict=2)
    fine = Run(engine, "hi", num_predict=2)
    drain(engine)
    assert fine.error is None and fine.done.eval_count == 2
