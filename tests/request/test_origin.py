"""The origin headers are untrusted: bounded in length and characters
(``origin_chars``), a bad one a ``ValueError`` (the API's 400) that never
echoes the value; and the kernel side sends only what the server takes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_llm.connect.origin import current_headers, origin_headers, set_source
from jupyter_llm.kernel.origin import kernel_id_from_file
from jupyter_llm.request.limits import ORIGIN_CHARS
from jupyter_llm.request.origin import NO_ORIGIN, PLAIN, Origin, cell_key, parse_origin

KID = "3f1c2a9e-8b7d-4c6e-9a1b-2d3e4f5a6b7c"
LONG = "k" * (ORIGIN_CHARS.value + 1)


def headers(**values):
    names = {"kernel": "X-LLM-Kernel", "cell": "X-LLM-Cell", "count": "X-LLM-Execution-Count"}
    given = {names[k]: v for k, v in values.items()}
    return given.get


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, NO_ORIGIN),  # any other client: "api"
        ({"kernel": KID}, Origin(KID, "", None)),
        ({"kernel": KID, "cell": "a1b2-c3", "count": "12"}, Origin(KID, "a1b2-c3", 12)),
        ({"kernel": " " + KID + " ", "count": " 7 "}, Origin(KID, "", 7)),
        ({"cell": "a1"}, NO_ORIGIN),  # a cell without its kernel
        ({"kernel": "k" * ORIGIN_CHARS.value}, Origin("k" * ORIGIN_CHARS.value)),  # at the limit
    ],
)
def test_parse_origin(values, expected):
    assert parse_origin(headers(**values)) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kernel": LONG}, "X-LLM-Kernel has 65 characters; the limit is 64"),
        ({"kernel": KID, "cell": LONG}, "X-LLM-Cell has 65 characters"),
        ({"cell": LONG}, "X-LLM-Cell has 65 characters"),
        ({"kernel": "<script>"}, "X-LLM-Kernel may hold only letters, digits"),
        ({"kernel": KID, "cell": "a b"}, "X-LLM-Cell may hold only"),
        ({"kernel": KID, "count": "-1"}, "X-LLM-Execution-Count must be a whole number"),
        ({"kernel": KID, "count": "1" * 10}, "X-LLM-Execution-Count must be a whole number"),
        ({"kernel": KID, "count": "٣"}, "must be a whole number"),  # a non-ASCII digit
    ],
)
def test_bad_origin_headers_are_refused_without_echo(values, message):
    with pytest.raises(ValueError, match=message) as caught:
        parse_origin(headers(**values))
    assert "<script>" not in str(caught.value) and LONG not in str(caught.value)


@pytest.mark.parametrize(
    ("origin", "key"),
    [(Origin(KID, "c1", 3), "c1"), (Origin(KID, "", 3), "In [3]"), (Origin(KID), "")],
)
def test_cell_key(origin, key):
    assert cell_key(origin) == key


@pytest.mark.parametrize(
    ("kernel", "cell", "count", "expected"),
    [
        (KID, "c1", 5, {"X-LLM-Kernel": KID, "X-LLM-Cell": "c1", "X-LLM-Execution-Count": "5"}),
        (KID, None, None, {"X-LLM-Kernel": KID}),
        (KID, "bad cell", True, {"X-LLM-Kernel": KID}),  # what the server refuses is left out
        (KID, LONG, -1, {"X-LLM-Kernel": KID}),
        (LONG, "c1", 5, {}),  # no kernel, no origin
        (None, "c1", 5, {}),
    ],
)
def test_client_headers(kernel, cell, count, expected):
    assert origin_headers(kernel, cell, count) == expected


def test_a_failing_source_sends_nothing():
    def broken():
        raise RuntimeError("no kernel")

    try:
        set_source(broken)
        assert current_headers() == {}
        set_source(lambda: {"X-LLM-Kernel": "k"})
        assert current_headers() == {"X-LLM-Kernel": "k"}
    finally:
        set_source(None)
    assert current_headers() == {}


@pytest.mark.parametrize(
    ("path", "kid"),
    [
        (f"/run/user/1000/jupyter/runtime/kernel-{KID}.json", KID),
        ("/tmp/kernel-abc.json", "abc"),
        ("/tmp/my-connection.json", "my-connection"),
    ],
)
def test_kernel_id_from_connection_file(path, kid):
    assert kernel_id_from_file(path) == kid


@pytest.mark.parametrize(("count", "running"), [(5, 4), (1, 0), (0, None), (None, None)])
def test_the_running_cells_count(count, running):
    from types import SimpleNamespace

    from jupyter_llm.kernel.origin import running_count

    assert running_count(SimpleNamespace(execution_count=count)) == running


@given(st.text(max_size=200), st.text(max_size=200), st.text(max_size=20))
@settings(max_examples=500, deadline=None)
def test_any_header_values_give_an_origin_or_a_clean_error(kernel, cell, count):
    """Whatever a client sends: an ``Origin`` of plain short values, or a
    ``ValueError`` (the 400), never anything else."""
    try:
        origin = parse_origin(headers(kernel=kernel, cell=cell, count=count))
    except ValueError:
        return
    for value in (origin.kernel, origin.cell):
        assert len(value) <= ORIGIN_CHARS.value and PLAIN.fullmatch(value)
