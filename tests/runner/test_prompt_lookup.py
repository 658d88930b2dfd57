"""Prompt lookup's drafts (``runner.prompt_lookup``): the longest matching
context wins, edits are learned as substitutions and unlearned when the
output does not take them, and every search is bounded. Pure: token ids in,
token ids out, fed as the engine feeds them (the tokens since the last
proposal, then a proposal)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_llm.request.limits import DRAFT_LOOKUP
from jupyter_llm.runner.prompt_lookup import (
    MAX_CANDIDATES,
    MAX_MATCH,
    MAX_SUBSTITUTIONS,
    REALIGN_WINDOW,
    PromptLookup,
)


def generate(lookup: PromptLookup, output: list[int], k: int = 8) -> list[list[int]]:
    """Feed ``output`` one token per step, proposing before each; the
    proposals made."""
    proposals = []
    for token in output:
        proposals.append(lookup.propose(k))
        lookup.extend([token])
    return proposals


@pytest.mark.parametrize(
    ("history", "k", "draft"),
    [
        ([1, 2, 3, 4, 5, 9, 2, 3], 3, [4, 5, 9]),  # "2 3" was followed by 4 5 9
        ([1, 2, 3, 4, 5, 9, 2, 3], 1, [4]),
        ([7, 8, 9, 1, 7, 8, 9], 4, [1, 7, 8, 9]),  # runs into the tail itself
        ([1, 2, 3, 4, 5], 4, []),  # no earlier occurrence
        ([5, 1, 2, 6, 3, 1, 2, 7, 0, 1, 2], 2, [7, 0]),  # the latest of equals
        ([4, 1, 2, -1, -1, 5, 1, 2], 4, []),  # never an image's marks
        ([4, 1, 2, 8, -1, 5, 1, 2], 4, [8]),
        ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2, [9, 2]),  # the longer context wins
        ([1, 2, 3, 1, 2], 0, []),  # k 0: nothing, though 3 would do
        ([1], 4, []),
    ],
)
def test_lookup(history, k, draft):
    assert PromptLookup(history).propose(k) == draft


def test_the_longest_context_wins_over_the_latest():
    """A phrase with two endings: the ending its longer context picks."""
    a = [9, 10, 11, 12, 13, 20, 21]  # "... it is a computer" -> 20 21
    b = [30, 10, 11, 12, 13, 40, 41]  # "... it is a computer" -> 40 41
    lookup = PromptLookup(a + b + a[:5])
    assert lookup.propose(2) == [20, 21]  # the latest 4-gram would say 40 41


def test_the_lookup_follows_a_growing_history():
    lookup = PromptLookup([10, 11, 12, 13])
    assert lookup.propose(2) == []
    lookup.extend([10, 11])
    assert lookup.propose(2) == [12, 13]
    lookup.extend([12, 20, 10, 11, 12])
    assert lookup.propose(2) == [20, 10]  # agreeing as far back as the first: the latest


# "orders" (1) renamed "purchases" (2) in a copied text
PROMPT = [50, 51, 10, 1, 11, 12, 1, 13, 14, 1, 15, 16, 60]


def test_a_replaced_token_is_learned_and_copied_in_its_place():
    lookup = PromptLookup(PROMPT)
    proposals = generate(lookup, [50, 51, 10, 2, 11, 12])
    assert proposals[2][:2] == [10, 1]  # not learned yet
    assert lookup.propose(7) == [2, 13, 14, 2, 15, 16, 60]


def test_a_replacement_of_two_tokens():
    lookup = PromptLookup(PROMPT)
    generate(lookup, [50, 51, 10, 2, 3, 11, 12])
    assert lookup.propose(4) == [2, 3, 13, 14]


def test_a_substitution_the_output_does_not_take_is_dropped():
    lookup = PromptLookup(PROMPT)
    generate(lookup, [50, 51, 10, 2, 11, 12])
    assert lookup.propose(3) == [2, 13, 14]
    generate(lookup, [1, 13, 14])  # the old token after all: the draft failed at 2
    assert lookup.substitutions == {}
    assert lookup.propose(2) == [1, 15]


@pytest.mark.parametrize(
    ("output", "learned"),
    [
        ([50, 51, 10, 2, 11], {1: (2,)}),  # one token for one, one agreeing after
        ([50, 51, 10, 2, 3, 11], {1: (2, 3)}),
        ([50, 51, 10, 2, 3, 4, 11], {}),  # three for one: one agreeing token is too little
        ([50, 51, 10, 2, 3, 4, 11, 12], {1: (2, 3, 4)}),  # two are enough
        ([50, 51, 10, 2, 3, 4, 5, 6, 11, 12], {}),  # more than MAX_REPLACEMENT
        ([50, 51, 10, 11], {}),  # a token left out is no substitution
        ([50, 51, 10, 2, 12], {}),  # nor two tokens replaced by one, on one token's word
    ],
)
def test_what_is_learned(output, learned):
    lookup = PromptLookup(PROMPT)
    generate(lookup, output)
    lookup.propose(1)
    assert lookup.substitutions == learned


def test_an_edit_is_followed_for_the_window_only():
    lookup = PromptLookup(PROMPT)
    generate(lookup, [50, 51, 10] + [70 + i for i in range(REALIGN_WINDOW)])
    lookup.propose(1)
    assert lookup.departed is not None
    lookup.extend([79])
    lookup.propose(1)
    assert lookup.departed is None


def test_a_partly_copied_replacement_goes_on_where_it_was():
    """A step that ends inside a learned two-token replacement: the next
    draft starts with its second token."""
    lookup = PromptLookup(PROMPT)
    generate(lookup, [50, 51, 10, 2, 3, 11, 12, 2])
    assert lookup.propose(4) == [3, 13, 14, 2]
    assert lookup.substitutions == {1: (2, 3)}


def test_the_agreement_is_counted_up_to_max_match():
    """Both earlier places agree past ``MAX_MATCH`` tokens, the first one
    longer: they score the same, and the latest wins."""
    context = list(range(100, 100 + MAX_MATCH + 2))
    first = [7, *context, 1]
    second = [8, *context[1:], 2]
    lookup = PromptLookup(first + second + [7, *context])
    assert lookup.propose(1) == [2]


def test_the_substitutions_are_bounded():
    n = MAX_SUBSTITUTIONS + 5
    prompt, output = [900, 901], [900, 901]
    for i in range(n):  # a text copied with n renames: 600 + i becomes 1000 + i
        prompt += [500, 600 + i, 501, 700 + i]
        output += [500, 1000 + i, 501, 700 + i]
    lookup = PromptLookup(prompt)
    generate(lookup, output)
    lookup.propose(1)
    assert lookup.substitutions == {600 + i: (1000 + i,) for i in range(MAX_SUBSTITUTIONS)}


def test_only_the_latest_candidates_are_compared():
    """The oldest place matches longest, but lies past ``MAX_CANDIDATES``
    newer places of the same pair."""
    oldest = [7, 8, 1, 2, 99]
    filler = []
    for i in range(MAX_CANDIDATES):
        filler += [300 + i, 1, 2, 400 + i]
    lookup = PromptLookup(oldest + filler + [7, 8, 1, 2])
    assert lookup.propose(1) == [400 + MAX_CANDIDATES - 1]
    shorter = PromptLookup(oldest + filler[4:] + [7, 8, 1, 2])
    assert shorter.propose(1) == [99]


def test_a_long_prompt_is_searched_in_its_last_tokens_only():
    n = DRAFT_LOOKUP.value
    lookup = PromptLookup([1, 2, 3] + [5] * n + [1, 2])
    assert lookup.propose(1) == []
    lookup = PromptLookup([1, 2, 3] + [5] * (n - 5) + [1, 2])
    assert lookup.propose(1) == [3]


# two lines told apart by their start: "90 orders 5 30 -> 31 20", "91 orders 5 30 -> 32 21"
LINES = [50, 51, 10, 1, 11, 12, 1, 13, 14, 90, 1, 5, 30, 31, 20, 91, 1, 5, 30, 32, 21]


@pytest.mark.parametrize(
    ("line", "draft"),
    [
        ([91, 2, 5], [30, 32]),  # the renamed token in the last pair
        ([90, 2, 5, 30], [31, 20]),  # before it: the earlier line, not the latest
    ],
)
def test_a_confirmed_substitution_counts_as_the_old_token_in_a_context(line, draft):
    lookup = PromptLookup(LINES)
    generate(lookup, [50, 51, 10, 2, 11, 12, 2, 13, 14])  # learned, then a draft taken at it
    assert lookup.confirmed == {2: 1}
    generate(lookup, line)
    assert lookup.propose(2) == draft


def test_a_substitution_not_confirmed_yet_does_not_match():
    lookup = PromptLookup(LINES)
    generate(lookup, [50, 51, 10, 2, 11, 91, 2, 5])
    assert lookup.substitutions == {1: (2,)} and lookup.confirmed == {}
    assert lookup.propose(2) == []


def test_a_dropped_substitution_is_no_longer_confirmed():
    lookup = PromptLookup(LINES)
    generate(lookup, [50, 51, 10, 2, 11, 12, 2, 13, 14, 90])
    assert lookup.propose(1) == [2]  # "90 orders": the learned name
    lookup.extend([1])  # the old one after all
    lookup.propose(1)
    assert lookup.substitutions == {} and lookup.confirmed == {}


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.lists(st.integers(-1, 6), max_size=60),
    steps=st.lists(
        st.tuples(st.integers(0, 17), st.lists(st.integers(0, 6), min_size=1, max_size=18)),
        max_size=40,
    ),
)
def test_whatever_comes_drafts_stay_sound_and_bounded(prompt, steps):
    """As the engine feeds it: a proposal, then the tokens kept (several
    at once after a draft). Never a raise, never more than ``k`` tokens,
    never an image's mark; substitutions bounded, confirmed ones backed."""
    lookup = PromptLookup(prompt)
    for k, came in steps:
        draft = lookup.propose(k)
        assert len(draft) <= k and all(t >= 0 for t in draft)
        lookup.extend(came)
        assert len(lookup.substitutions) <= MAX_SUBSTITUTIONS
        for new, old in lookup.confirmed.items():
            assert lookup.substitutions.get(old) == (new,)
        assert all(len(places) <= 2 * MAX_CANDIDATES for places in lookup.places.values())
