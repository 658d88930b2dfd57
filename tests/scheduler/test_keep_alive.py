"""Durations (keep_alive, load_timeout): a pure parser raising plain ValueError."""

import math

import pytest

from jupyter_llm.request.durations import FOREVER, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (1.5, 1.5),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("-1s", FOREVER),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("90", 90.0),
        ("0", 0.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
    ],
)
def test_valid(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [True, False, [], {}, "", "10x", "m", "5 minutes", "1h-3m"])
def test_invalid(value):
    with pytest.raises(ValueError, match="keep_alive"):
        parse_duration(value)


def test_nan_refused():
    with pytest.raises(ValueError):
        parse_duration(math.nan)


def test_error_names_the_field_and_the_value():
    with pytest.raises(ValueError, match="invalid load_timeout: 'soon'"):
        parse_duration("soon", "load_timeout")
