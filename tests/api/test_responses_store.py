"""The store behind ``previous_response_id`` (``api/response_store.py``):
per user, bounded by count, bytes and age, and the pure translation of
input items to the chat (``api/openai_responses_shapes.py``)."""

from __future__ import annotations

import pytest

from jupyter_llm.api.openai_responses_output import stored_turn, whole_output
from jupyter_llm.api.openai_responses_shapes import Items, input_messages
from jupyter_llm.api.response_store import ResponseStore
from jupyter_llm.request.limits import STORED_BYTES, STORED_RESPONSES, STORED_SECONDS

CHAT = [{"role": "user", "content": "hi"}]


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_defaults_are_the_limits_table():
    store = ResponseStore()
    assert store.per_user == STORED_RESPONSES.value
    assert store.total_bytes == STORED_BYTES.value and store.seconds == STORED_SECONDS.value


def test_another_users_response_is_not_found():
    store = ResponseStore()
    assert store.put("alice", "resp_1", CHAT, 10)
    assert store.get("alice", "resp_1") == CHAT
    assert store.get("bob", "resp_1") is None and store.get("alice", "resp_2") is None


def test_a_response_is_removed_only_by_its_user():
    store = ResponseStore()
    store.put("alice", "resp_1", CHAT, 10, {"id": "resp_1"})
    assert store.find("alice", "resp_1").response == {"id": "resp_1"}
    assert not store.remove("bob", "resp_1") and store.find("bob", "resp_1") is None
    assert store.remove("alice", "resp_1") and store.bytes == 0
    assert not store.remove("alice", "resp_1") and store.get("alice", "resp_1") is None


def test_each_user_keeps_the_newest_responses():
    store = ResponseStore(per_user=2)
    for i in range(3):
        store.put("alice", f"a{i}", CHAT, 1)
    store.put("bob", "b0", CHAT, 1)
    assert [store.get("alice", f"a{i}") is not None for i in range(3)] == [False, True, True]
    assert store.get("bob", "b0") == CHAT  # alice's count is hers alone


def test_the_bytes_of_all_users_are_bounded_oldest_first():
    store = ResponseStore(total_bytes=100)
    store.put("alice", "a", CHAT, 60)
    store.put("bob", "b", CHAT, 30)
    store.put("carol", "c", CHAT, 50)  # 140 > 100: alice's, the oldest, goes
    assert store.get("alice", "a") is None and store.get("bob", "b") and store.get("carol", "c")
    assert store.bytes == 80
    assert not store.put("dave", "d", CHAT, 101)  # larger than the whole store: not kept
    assert store.get("dave", "d") is None and store.bytes == 80


def test_a_response_expires():
    clock = Clock()
    store = ResponseStore(seconds=60, clock=clock)
    store.put("alice", "a", CHAT, 5)
    clock.now += 59
    store.put("alice", "b", CHAT, 5)
    assert store.get("alice", "a") == CHAT
    clock.now += 2
    assert store.get("alice", "a") is None and store.get("alice", "b") == CHAT
    assert store.bytes == 5


def test_input_items_become_the_chat():
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
    ]
    chat = input_messages(items, Items())
    assert [m["role"] for m in chat] == ["developer", "user", "assistant", "tool", "tool"]
    assistant = chat[2]
    assert assistant["reasoning"] == "think"
    assert assistant["content"] == [{"type": "text", "text": "calling"}]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["f", "g"]
    assert chat[3] == {"role": "tool", "content": "two", "tool_call_id": "c2", "tool_name": "g"}


@pytest.mark.parametrize("raw", ["", "just a string"])
def test_a_string_input_is_one_user_message(raw):
    assert input_messages(raw, Items()) == [{"role": "user", "content": raw}]


def test_a_stored_turn_keeps_the_answers_calls():
    from jupyter_llm.api.generation import Finished, Reply

    reply = Reply(
        text="",
        thinking="hm",
        tool_calls=[{"id": "c9", "name": "f", "arguments": {"x": 1}}],
        logprobs=[],
        finished=Finished("stop", 0, 0, 0, 0, 0, 0, []),
    )
    turn = stored_turn(whole_output(reply))
    assert turn["reasoning"] == "hm" and turn["content"] == ""
    assert turn["tool_calls"] == [
        {"id": "c9", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    ]


def test_past_the_byte_bound_the_heaviest_user_gives_way():
    """The byte bound is for all users together: dropping the oldest first,
    one user sending 32 MiB conversations pushed out everyone else's
    ``previous_response_id`` chains. The heaviest user's oldest go first."""
    store = ResponseStore(total_bytes=100)
    assert store.put("ann", "a1", CHAT, 10)
    assert store.put("ann", "a2", CHAT, 10)
    for i in range(10):  # bob fills the rest again and again
        assert store.put("bob", f"b{i}", CHAT, 30)
    assert store.get("ann", "a1") == CHAT and store.get("ann", "a2") == CHAT
    assert [k for k in store.entries if k.startswith("b")] == ["b8", "b9"]
    assert store.bytes == 80 and store.user_bytes == {"ann": 20, "bob": 60}
    store.remove("bob", "b9")
    assert store.user_bytes == {"ann": 20, "bob": 30}
