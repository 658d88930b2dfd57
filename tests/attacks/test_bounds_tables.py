"""Built from the route and option tables, as the auth test is: a new route
that reads its body without the bounded parser, a new option without a
bound, or a limit the README does not list, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from routes import routes

from jupyter_llm.api import handlers
from jupyter_llm.api.ollama import BlobHandler, RootHandler
from jupyter_llm.request.limits import (
    BODY_BYTES,
    BODY_DEPTH,
    DRAFT_TOKENS,
    OPTION_BOUNDS,
    REPEAT_LAST_N,
    STOP_STRINGS,
    TABLE,
    Limit,
)
from jupyter_llm.request.options import OPTION_TYPES

README = Path(__file__).parents[2] / "README.md"
# Routes whose body is not JSON: a blob upload streams bytes to disk, bounded
# by the disk (and checked against its digest), never held in memory.
BINARY = {BlobHandler}
BODY_ROUTES = sorted(
    (path, method)
    for path, method in routes()
    if method in ("POST", "DELETE") and not path.startswith("api/blobs/")
)
# A value past each option's Limit; a Limit-bounded option missing here fails.
PAST = {
    "stop": [f"s{i}" for i in range(STOP_STRINGS.value + 1)],
    "repeat_last_n": REPEAT_LAST_N.value + 1,
    "draft_num_predict": DRAFT_TOKENS.value + 1,
}


def test_every_route_holds_a_json_body_to_the_body_limit():
    for _, handler in handlers():
        if handler is not RootHandler and handler not in BINARY:  # the heartbeat reads none
            assert handler.max_body <= BODY_BYTES.value, handler


@pytest.mark.parametrize(("path", "method"), BODY_ROUTES)
@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"a": ' * (BODY_DEPTH.value + 1) + "1" + "}" * (BODY_DEPTH.value + 1), BODY_DEPTH.key),
        ('{"model": "tiny", "x": "\\udfff"}', "lone UTF-16 surrogate"),
    ],
    ids=["depth", "surrogate"],
)
async def test_every_json_route_parses_through_the_bounded_parser(
    users, installed_model, path, method, body, says
):
    attacker, _ = users
    answer = await attacker.fetch(path, body.encode(), method=method)
    assert answer.code == 400, (path, answer.body[:200])
    assert says in answer.body.decode(), (path, answer.body[:200])


def test_every_option_has_a_bound():
    assert set(OPTION_BOUNDS) == set(OPTION_TYPES)
    for name, bound in OPTION_BOUNDS.items():
        assert isinstance(bound, Limit) or (isinstance(bound, str) and bound), name


@pytest.mark.parametrize(
    "name", sorted(n for n, b in OPTION_BOUNDS.items() if isinstance(b, Limit))
)
async def test_every_limited_option_is_refused_past_its_limit(users, installed_model, name):
    assert name in PAST, f"add a value past {name}'s limit to PAST"
    attacker, _ = users
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {name: PAST[name]}}
    status, answer = await attacker.json("api/generate", body)
    assert status == 400, answer
    assert OPTION_BOUNDS[name].key in json.dumps(answer), answer


def test_the_readme_lists_every_limit():
    security = README.read_text().split("## Security", 1)[1]
    for limit in TABLE:
        row = next((line for line in security.splitlines() if f"`{limit.key}`" in line), None)
        assert row is not None, f"README's Security table lacks {limit.key}"
        value = limit.shown or f"{limit.value:,} {limit.unit}"
        assert value in row, (limit.key, value, row)
    assert re.search("lone UTF-16 surrogate", security)
