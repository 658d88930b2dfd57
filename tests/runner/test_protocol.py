"""The runner's typed wire messages: one definition each, read strictly on
both sides of the socket (an unknown or missing field is refused, never dropped)."""

from __future__ import annotations

import pytest

from jupyter_llm.api.generation import Finished, runner_events
from jupyter_llm.request.errors import RunnerFailed
from jupyter_llm.runner.protocol import (
    INVALID,
    Complete,
    Done,
    Embed,
    Error,
    Health,
    LoadParams,
    ProtocolError,
    Token,
    ToolCallsReply,
    compact,
    fields_of,
    read,
)


@pytest.mark.parametrize(
    ("kind", "message", "expected"),
    [
        (LoadParams, {"id": 1, "op": "load", "path": "/m"}, LoadParams(path="/m")),
        (
            LoadParams,
            {"path": "/m", "tensor_split": [1.0, 2.0], "flash_attn": "on"},
            LoadParams(path="/m", tensor_split=(1.0, 2.0), flash_attn="on"),
        ),
        (Complete, {"id": 2, "op": "complete"}, Complete()),
        (Complete, {"prompt": "hi", "truncate": False}, Complete(prompt="hi", truncate=False)),
        (Embed, {"inputs": ["a"]}, Embed(inputs=["a"])),
        (Done, {"id": 3, "type": "done", "eval_count": 2}, Done(eval_count=2)),
    ],
)
def test_read(kind, message, expected):
    assert read(kind, message) == expected


@pytest.mark.parametrize(
    ("kind", "message", "error"),
    [
        (LoadParams, {"path": "/m", "n_cxt": 8}, "LoadParams has no field 'n_cxt'"),
        (LoadParams, {"n_ctx": 8}, "LoadParams needs 'path'"),
        (LoadParams, {"path": "/m", "flash_attn": "yes"}, "flash_attn must be one of"),
        (Complete, {"promt": "hi"}, "Complete has no field 'promt'"),
        (Embed, {"input": ["a"]}, "Embed has no field 'input'"),
        (Done, {"eval_count": 1, "evals": 2}, "Done has no field 'evals'"),
    ],
)
def test_unknown_or_missing_fields_are_refused(kind, message, error):
    with pytest.raises(ProtocolError, match=error):
        read(kind, message)


@pytest.mark.parametrize(
    "message",
    [
        LoadParams(path="/m", tensor_split=(1.0,), flash_attn="off"),
        Complete(prompt="hi", options={"temperature": 0}, logprobs=True, top_logprobs=2),
        Embed(inputs=["a", "b"], dimensions=4, normalize=None),
        Done(done_reason="length", eval_count=3, context=[1, 2]),
        Token("a", thinking="b", logprobs=[{"token": "a", "logprob": -0.5}]),
        Token(""),
        ToolCallsReply([{"id": "c", "name": "f", "arguments": {}}]),
        Health("ok", loaded=True, busy=None, progress=3, stalled_for=0.0),
        Error("no", INVALID),
        Error("broken"),
    ],
)
def test_each_message_reads_back_as_itself(message):
    assert read(type(message), {"id": 7, **fields_of(message)}) == message
    assert read(type(message), {"id": 7, **compact(message)}) == message


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        (Token("a"), {"text": "a"}),
        (Token("", logprobs=[{}]), {"text": "", "logprobs": [{}]}),
        (Error("broken"), {"error": "broken"}),
        (Error("no", INVALID), {"error": "no", "kind": INVALID}),
    ],
)
def test_compact_leaves_out_what_is_at_its_default(message, wire):
    assert compact(message) == wire


def test_the_server_reads_done_strictly():
    done = {"type": "done", **fields_of(Done(eval_count=4))}
    assert runner_events(done, None) == [Done(eval_count=4)]
    with pytest.raises(RunnerFailed, match="Done has no field 'eval_cnt'"):
        runner_events({"type": "done", "eval_cnt": 4}, None)


@pytest.mark.parametrize(
    ("message", "think", "events"),
    [
        ({"type": "token", "text": "a"}, None, ["a"]),
        ({"type": "token", "text": "", "thinking": "t"}, None, ["t"]),
        ({"type": "token", "text": "a", "thinking": "t"}, False, ["a"]),
    ],
)
def test_token_events(message, think, events):
    got = runner_events(message, think)
    assert [getattr(e, "text", e) for e in got] == events
    assert not any(isinstance(e, Finished) for e in got)


def test_a_message_goes_on_the_wire_without_a_deep_copy():
    """``asdict`` copied every message and token id of a request on the
    server's loop (0.46 s for a chat of 80k messages): the fields are
    passed as they are, a nested typed value as its fields."""
    from jupyter_llm.runner.protocol import Complete, fields_of

    messages = [{"role": "user", "content": "hi"}] * 1000
    context = list(range(1000))
    wire = fields_of(Complete(messages=messages, context=context))
    assert wire["messages"] is messages and wire["context"] is context


def test_a_requests_error_never_quotes_the_runners_stderr():
    """The runner's last error line on stderr explains a failed load; beside
    other requests it may be another user's, so a request's error is its own."""
    from jupyter_llm.runner_client.process import RunnerProcess

    process = RunnerProcess(label="runner")
    process.last_error = "error: user B's prompt was: secret"
    reply = {"id": 1, "type": "error", "error": "the sampler failed"}
    assert str(process._failure(reply, explained=False)) == "the sampler failed"
    assert "secret" in str(process._failure(reply, explained=True))  # a load's
