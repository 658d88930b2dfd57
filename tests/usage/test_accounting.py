"""The pure accounting: samples added to totals, the figures shown, who may
read whose rows. Tables of plain values."""

from __future__ import annotations

import pytest

from jupyter_llm.usage.accounting import (
    Sample,
    Totals,
    added,
    device_seconds,
    figures,
    mean_first_token,
    tokens_per_second,
    visible_users,
)


@pytest.mark.parametrize(
    ("held", "devices", "expected"),
    [
        (3.0, 1, 3.0),  # one GPU, 3 s
        (3.0, 2, 6.0),  # split over two devices: each held
        (0.5, 0, 0.5),  # no allocation known: the CPU still held it
        (-1.0, 2, 0.0),  # a clock that went back counts nothing
    ],
)
def test_device_seconds(held, devices, expected):
    assert device_seconds(held, devices) == expected


def test_samples_add_up():
    a = Sample("m", prompt_tokens=10, generated_tokens=20, first_token_s=0.5, decode_s=2.0,
               held_s=3.0, devices=2)  # fmt: skip
    b = Sample("m", prompt_tokens=5, generated_tokens=0, first_token_s=None, decode_s=0.0,
               held_s=1.0, devices=2)  # fmt: skip
    totals = added(added(Totals(), a), b)
    assert totals == Totals(
        requests=2, prompt_tokens=15, generated_tokens=20, first_token_s=0.5, first_tokens=1,
        decode_s=2.0, device_s=8.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("totals", "rate", "first"),
    [
        (Totals(), None, None),
        (Totals(requests=1, generated_tokens=20, decode_s=2.0), 10.0, None),
        (Totals(requests=2, generated_tokens=20, decode_s=0.0), None, None),  # untimed
        (Totals(requests=2, first_token_s=1.0, first_tokens=2), None, 0.5),
    ],
)
def test_rates(totals, rate, first):
    assert tokens_per_second(totals) == rate
    assert mean_first_token(totals) == first


def test_figures_are_the_routes_fields():
    totals = Totals(requests=3, prompt_tokens=7, generated_tokens=30, first_token_s=0.3,
                    first_tokens=3, decode_s=1.5, device_s=4.25)  # fmt: skip
    assert figures(totals) == {
        "requests": 3, "prompt_tokens": 7, "generated_tokens": 30, "tokens_per_second": 20.0,
        "time_to_first_token": 0.1, "decode_seconds": 1.5, "device_seconds": 4.25,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("asker", "admin", "asked", "expected"),
    [
        ("alice", False, None, "alice"),  # a user reads their own rows
        ("alice", False, "alice", "alice"),
        ("root", True, None, None),  # an admin reads everyone's
        ("root", True, "alice", "alice"),
        ("alice", False, "bob", PermissionError),  # never another's
    ],
)
def test_visible_users(asker, admin, asked, expected):
    if expected is PermissionError:
        with pytest.raises(PermissionError):
            visible_users(asker, admin, asked)
    else:
        assert visible_users(asker, admin, asked) == expected
