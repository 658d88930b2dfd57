"""Fuzz the JSON handlers of a live server with hypothesis: generated bodies
(500 by default, 2,200 with ``JUPYTER_LLM_DEEP_FUZZ=1``), no 5xx, no hang, no
runner left behind."""

from __future__ import annotations

import json

import psutil
import pytest
from fuzz_depth import TIMEOUT, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_server import LiveServer

from jupyter_llm.api.requests import OPTION_TYPES
from jupyter_llm.models.store import ModelStore

ROUTES = [
    "api/generate",
    "api/chat",
    "api/embed",
    "api/embeddings",
    "api/show",
    "api/plan",
    "api/copy",
    "api/create",
    "api/blobs/sha256:" + "0" * 64,
    "v1/chat/completions",
    "v1/completions",
    "v1/embeddings",
    "v1/responses",
    "v1/messages",
    "v1/messages/count_tokens",
]
FIELDS = [
    "model",
    "prompt",
    "messages",
    "stream",
    "options",
    "keep_alive",
    "format",
    "system",
    "raw",
    "template",
    "suffix",
    "context",
    "input",
    "truncate",
    "dimensions",
    "source",
    "destination",
    "files",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "response_format",
    "encoding_format",
    "n",
    "images",
    "tools",
    "verbose",
    "name",
    "instructions",
    "max_output_tokens",
    "previous_response_id",
    "text",
    "tool_choice",
    "thinking",
    "stop_sequences",
    "top_k",
    "priority",
]
MAX_LOADED = 2

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 20),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(
        ["tiny", "tiny:latest", "json", "", "5m", "-1", "0", "../x", "a/b/c/d", "hf.co/u/r:Q4"]
    ),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
options = st.dictionaries(st.sampled_from(sorted(OPTION_TYPES)), scalars, max_size=4) | json_values
messages = (
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant", "bot", 3]),
                "content": st.text(max_size=10) | json_values,
            }
        ),
        max_size=3,
    )
    | json_values
)
schemas = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["object", "string", "integer", "nonsense"]),
        "properties": st.dictionaries(
            st.text(min_size=1, max_size=5),
            st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "boolean"])}),
            max_size=2,
        ),
    }
)
special = {
    "model": st.sampled_from(["tiny", "tiny:latest", "nope"]) | json_values,
    "options": options,
    "messages": messages,
    "format": schemas | json_values,
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["json_object", "json_schema", "text", "xml"])}
    )
    | json_values,
    "max_tokens": st.integers(-2, 8) | json_values,
    "max_output_tokens": st.integers(-2, 8) | json_values,
    "thinking": st.fixed_dictionaries(
        {
            "type": st.sampled_from(["enabled", "disabled", "x"]),
            "budget_tokens": st.integers(-2, 2048),
        }
    )
    | json_values,
    "stream": st.booleans() | json_values,
    "keep_alive": st.sampled_from([-1, 0, 30, "1m", "2s", "x"]) | json_values,
}
bodies = (
    st.fixed_dictionaries({}, optional={field: special.get(field, json_values) for field in FIELDS})
    | json_values
)


def bounded(body):
    """``body`` with any generation it asks for kept short: a context shift
    lets ``num_predict: -1`` run for ever on a model that never says stop."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    options = body.get("options")
    if options is None:
        body["options"] = {"num_predict": 8}
    elif isinstance(options, dict):
        n = options.get("num_predict")
        if n is None or (isinstance(n, int) and not isinstance(n, bool) and not 0 <= n <= 64):
            body["options"] = {**options, "num_predict": 8}
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 8
    n = body.get("max_output_tokens")
    if n is None or (isinstance(n, int) and not isinstance(n, bool) and not 0 <= n <= 64):
        body["max_output_tokens"] = 8
    return body


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    """A real Jupyter server in its own process, with the demo model installed."""
    models = tmp_path_factory.mktemp("fuzz-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    live = LiveServer(
        models,
        models,
        {"JUPYTER_LLM_MAX_LOADED_MODELS": str(MAX_LOADED), "JUPYTER_LLM_KEEP_ALIVE": "30s"},
    )
    yield live
    live.stop()


@pytest.mark.timeout(TIMEOUT)
@settings(
    max_examples=examples(500, 2200),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_fuzz_json_handlers(server, route, body):
    r = server.client.post(route, content=json.dumps(bounded(body)))
    assert r.status_code < 500, (route, body, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error, str | dict) and error
    assert len(server.runners()) <= MAX_LOADED + 1  # loaded models (+ one discovery runner)


def test_no_runner_left_behind_after_fuzzing(server):
    server.client.post("api/generate", json={"model": "tiny"})  # make sure one is loaded
    spawned = server.runners()
    assert spawned
    server.stop()  # SIGTERM, as a user stopping Jupyter would
    psutil.wait_procs(spawned, timeout=10)
    assert not [p for p in spawned if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
