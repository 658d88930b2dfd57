"""Slot choice, context shift and truncation rules, table-driven."""

import pytest

from jupyter_llm.runner.context_window import (
    SlotView,
    choose_slot,
    common_prefix,
    fit_history,
    keep_count,
    shift_span,
    swa_reusable,
    truncation,
)


@pytest.mark.parametrize(
    "a, b, n",
    [([], [1], 0), ([1, 2, 3], [1, 2, 4], 2), ([1, 2], [1, 2, 3], 2), ([5], [6], 0)],
)
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n


@pytest.mark.parametrize(
    "slots, prompt, expected",
    [
        # the longest shared prefix wins, whatever its age
        ([(0, [1, 2, 3], 5.0), (1, [1, 2, 9], 1.0), (2, [], 0.0)], [1, 2, 3, 4], (0, 3)),
        # equal prefixes: the least recently used
        ([(0, [1, 7], 5.0), (1, [1, 8], 1.0)], [1, 2], (1, 1)),
        # nothing shared: the least recently used, an empty one first
        ([(0, [4, 5], 2.0), (1, [6], 1.0), (2, [], 0.0)], [1, 2], (2, 0)),
        ([(0, [4, 5], 2.0), (1, [6], 1.0)], [1, 2], (1, 0)),
        # a cache longer than the prompt still matches the whole prompt
        ([(0, [1, 2, 3, 4], 1.0), (1, [], 0.0)], [1, 2], (0, 2)),
    ],
)
def test_choose_slot(slots, prompt, expected):
    views = [SlotView(i, cached, used) for i, cached, used in slots]
    assert choose_slot(views, prompt) == expected


def test_choose_slot_needs_an_idle_slot():
    with pytest.raises(ValueError):
        choose_slot([], [1])


@pytest.mark.parametrize(
    "num_keep, n_tokens, keep",
    [(4, 100, 4), (0, 100, 0), (-1, 100, 99), (200, 100, 99), (4, 1, 0)],
)
def test_keep_count(num_keep, n_tokens, keep):
    assert keep_count(num_keep, n_tokens) == keep


@pytest.mark.parametrize(
    "n_past, num_keep, span",
    [
        (256, 4, (4, 130)),  # keeps 4 and the most recent half of the other 252
        (256, 0, (0, 128)),
        (11, 4, (4, 7)),
        (2, 4, (1, 1)),  # nothing left to discard
    ],
)
def test_shift_span(n_past, num_keep, span):
    assert shift_span(n_past, num_keep) == span


@pytest.mark.parametrize(
    "n_tokens, n_ctx, num_keep, head, tail",
    [
        (10, 16, 4, 10, 0),  # fits: unchanged
        (100, 16, 4, 4, 11),  # first num_keep, then the end: 15 tokens
        (100, 16, 0, 0, 15),
        (100, 16, 50, 14, 1),  # num_keep never leaves no room for the end
    ],
)
def test_truncation_keeps_the_head_and_the_end(n_tokens, n_ctx, num_keep, head, tail):
    tokens = list(range(n_tokens))
    kept_head, kept_tail = truncation(n_tokens, n_ctx, num_keep)
    cut = tokens[:kept_head] + tokens[kept_tail:]
    assert cut[:head] == tokens[:head] and len(cut) == min(n_tokens, n_ctx - 1)
    if tail:
        assert cut[head:] == tokens[-tail:]


@pytest.mark.parametrize(
    "n_past, num_keep, spans, span",
    [
        (100, 4, [(10, 30)], (4, 52)),  # an image clear of both cuts changes nothing
        (100, 4, [(2, 18)], (18, 59)),  # an image across the head's end stays in it
        (100, 4, [(40, 60)], (4, 60)),  # one across the discarded end goes whole
        (100, 4, [(2, 18), (50, 90)], (18, 90)),
        (100, 4, [(4, 20)], (4, 52)),  # starting at the head's end: no cut
        (30, 4, [(1, 29)], (29, 29)),  # the head holds all but one: no shift
    ],
)
def test_shift_span_never_cuts_an_image(n_past, num_keep, spans, span):
    assert shift_span(n_past, num_keep, spans) == span
    start, end = span
    assert all(not (s < start < e or s < end < e) for s, e in spans)


@pytest.mark.parametrize(
    "n_tokens, n_ctx, num_keep, spans, cut",
    [
        (10, 16, 4, [(2, 8)], (10, 10)),  # fits
        (100, 16, 4, [], (4, 89)),
        (100, 16, 4, [(2, 20)], (2, 89)),  # the image across the head goes whole
        (100, 16, 4, [(80, 95)], (4, 95)),  # the image across the tail goes whole
        (100, 16, 4, [(90, 98)], (4, 89)),  # an image in the kept end stays
    ],
)
def test_truncation_never_cuts_an_image(n_tokens, n_ctx, num_keep, spans, cut):
    head, tail = truncation(n_tokens, n_ctx, num_keep, spans)
    assert (head, tail) == cut
    assert head + (n_tokens - tail) <= min(n_tokens, n_ctx - 1)  # what is kept fits
    assert all(not (s < head < e or s < tail < e) for s, e in spans)


def chat(*roles: str) -> list[dict]:
    return [{"role": r, "content": f"{r}{i}"} for i, r in enumerate(roles)]


CHAT = chat("system", "user", "assistant", "user")


@pytest.mark.parametrize(
    "messages, budget, kept",
    [
        (
            chat("system", "user", "assistant", "user"),
            10,
            ["system0", "user1", "assistant2", "user3"],
        ),
        (chat("system", "user", "assistant", "user"), 2, ["system0", "user3"]),
        (chat("system", "user", "assistant", "user"), 3, ["system0", "assistant2", "user3"]),
        (chat("user", "assistant", "system", "user"), 2, ["system2", "user3"]),  # every system
        (chat("system", "user"), 1, ["system0", "user1"]),  # never below system + latest
        (chat("user"), 0, ["user0"]),
    ],
)
def test_fit_history(messages, budget, kept):
    result = fit_history(messages, lambda ms: len(ms) <= budget)
    assert [m["content"] for m in result] == kept


@pytest.mark.parametrize(
    ("keep", "pos_min", "n_swa", "reusable"),
    [
        (100, 0, 0, 100),  # no window: any prefix
        (0, -1, 512, 0),
        (1925, 901, 512, 1925),  # the window before position 1925 is still held
        (640, 901, 512, 0),  # overwritten: decode again from the start
        (300, 0, 512, 300),  # shorter than the window, all of it held
        (300, 10, 512, 0),
        (300, -1, 512, 0),  # nothing cached
    ],
)
def test_swa_reusable(keep, pos_min, n_swa, reusable):
    assert swa_reusable(keep, pos_min, n_swa) == reusable


def test_fit_history_tries_the_least_first_when_even_it_may_not_fit():
    """A system message too long for the context alone: two checks, not a
    binary search that renders and tokenizes it at each step (a minute)."""
    messages = [{"role": "system", "content": "s" * 1000}] + [
        {"role": "user", "content": f"m{i}"} for i in range(16_384)
    ]
    tried: list[int] = []

    def fits(kept: list[dict]) -> bool:
        tried.append(len(kept))
        return False

    assert [m["content"] for m in fit_history(messages, fits)][1:] == ["m16383"]
    assert tried == [16_385, 2]
