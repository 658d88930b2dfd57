"""The notebook side: magics through an IPython shell, the dashboard widget,
results, and embedded mode."""

from __future__ import annotations

import json

import pytest
from IPython.core.interactiveshell import InteractiveShell
from live_server import LiveServer

from jupyter_llm.kernel.connection import Engine
from jupyter_llm.kernel.magics import (
    LLMMagics,
    MagicUsageError,
    interpolate,
    parse_cell_args,
    resolve_format,
)
from jupyter_llm.kernel.results import Chat, Generation, Metrics
from jupyter_llm.kernel.widgets import DeviceDashboard, countdown, memory_segments
from jupyter_llm.models.store import ModelStore

GiB = 1 << 30
SIMULATED = [
    {
        "id": "GPU-0",
        "library": "CUDA",
        "name": "RTX Sim",
        "total_memory": 8 * GiB,
        "free_memory": 7 * GiB,
    }
]


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("kernel-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    server = LiveServer(models, models, {"JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(SIMULATED)})
    yield server
    server.stop()


@pytest.fixture
def shell(live):
    ip = InteractiveShell.instance()
    magics = LLMMagics(shell=ip, engine=Engine(live.url, live.token, "env"))
    ip.register_magics(magics)
    ip.user_ns.pop("history", None)
    yield ip
    ip.user_ns.clear()


def run(shell, line, cell="Say hello"):
    return shell.run_cell_magic("llm", line, cell)


# -- parsing (pure) -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "check"),
    [
        ("tiny", lambda a: a.model == "tiny" and a.stream and a.options == {}),
        (
            "tiny -t 0.2 --seed 3 -n 9 --num-ctx 512",
            lambda a: (
                a.options == {"temperature": 0.2, "seed": 3, "num_predict": 9, "num_ctx": 512}
            ),
        ),
        (
            "tiny --options '{\"top_k\": 5}' -t 0",
            lambda a: a.options == {"top_k": 5, "temperature": 0.0},
        ),
        (
            'tiny -s "be brief" -f json -o out --chat c --no-stream -i --keep-alive 10m',
            lambda a: (
                (a.system, a.format, a.out, a.chat, a.stream, a.interpolate, a.keep_alive)
                == ("be brief", "json", "out", "c", False, True, "10m")
            ),
        ),
        ("", lambda a: a.model is None),
    ],
)
def test_parse_cell_args(line, check):
    assert check(parse_cell_args(line))


@pytest.mark.parametrize(
    "line",
    [
        "tiny --options nope",
        "tiny -t hot",
        "tiny --bogus",
        "tiny --options '[1]'",
        "tiny 'unclosed",
    ],
)
def test_parse_cell_args_errors(line):
    with pytest.raises(MagicUsageError):
        parse_cell_args(line)


def test_interpolate():
    assert interpolate("a {x} {{literal}}", {"x": 1}) == "a 1 {literal}"
    with pytest.raises(MagicUsageError, match="'y' is not defined"):
        interpolate("{y}", {})


def test_resolve_format():
    assert resolve_format(None, {}) == (None, None)
    fmt, parse = resolve_format("json", {})
    assert fmt == "json" and parse('{"a": 1}') == {"a": 1}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt, parse = resolve_format("s", {"s": schema})
    assert fmt is schema and parse('{"a": 2}') == {"a": 2}
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        parse('{"a": "x"}')
    with pytest.raises(MagicUsageError, match="neither 'json' nor a variable"):
        resolve_format("missing", {})
    with pytest.raises(MagicUsageError, match="pydantic"):
        resolve_format("n", {"n": 3})


def test_pydantic_format():
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str

    fmt, parse = resolve_format("City", {"City": City})
    assert fmt["properties"]["name"]["type"] == "string"
    assert parse('{"name": "Oslo"}') == City(name="Oslo")


def test_generation_reprs():
    g = Generation(
        "hi",
        Metrics(
            "tiny",
            eval_count=10,
            eval_duration_ns=10**9,
            load_duration_ns=2 * 10**9,
            done_reason="stop",
        ),
    )
    bundle = g._repr_mimebundle_()
    assert "tiny · 10 tokens · 10.0 tok/s · load 2.00 s" in bundle["text/markdown"]
    assert bundle["text/plain"].startswith("hi") and str(g) == "hi"
    assert "```json" in Generation("{}", g.metrics, data={"a": 1})._repr_markdown_()


def test_memory_segments():
    models = [
        {
            "name": "a",
            "allocations": [
                {"device": "GPU-0", "weights": 100, "kv_cache": 20, "graph": 5},
                {"device": "cpu", "weights": 7, "kv_cache": 0, "graph": 0},
            ],
        }
    ]
    segs = memory_segments("GPU-0", total=1000, free=800, models=models)
    assert [(s.kind, s.size) for s in segs] == [
        ("weights", 100),
        ("kv_cache", 20),
        ("graph", 5),
        ("other", 75),
        ("free", 800),
    ]
    assert [s.kind for s in memory_segments("GPU-1", 1000, 1000, models)] == ["free"]


def test_countdown():
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert countdown((now + timedelta(seconds=125)).isoformat(), now) == "unloads in 2:05"
    assert countdown("2318-01-01T00:00:00Z", now) == "kept loaded"


# -- magics against a live server ------------------------------------------------------------
def test_cell_magic_returns_generation(shell):
    g = run(shell, "tiny -n 6 -t 0")
    assert isinstance(g, Generation) and g.text and g.metrics.eval_count == 6
    assert g.metrics.model == "tiny" and g.metrics.done_reason == "length"
    assert run(shell, "tiny -n 6 -t 0 --no-stream").text == g.text


def test_format_from_a_schema_variable_and_out(shell):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
    }
    shell.user_ns["schema"] = schema
    g = run(shell, "tiny -f schema -o result --seed 3 -n 200")
    jsonschema.validate(g.data, schema)
    assert shell.user_ns["result"] == g.data
    run(shell, "tiny -o text -n 3")
    assert isinstance(shell.user_ns["text"], str)


def test_chat_history(shell):
    first = run(shell, "tiny --chat history -n 3 -t 0 -s 'be kind'", "hi")
    chat = shell.user_ns["history"]
    assert isinstance(chat, Chat) and [m["role"] for m in chat.messages] == [
        "system",
        "user",
        "assistant",
    ]
    second = run(shell, "--chat history -n 3 -t 0", "and then?")  # model remembered
    assert len(chat.messages) == 5
    assert second.metrics.prompt_eval_count > first.metrics.prompt_eval_count


def test_braces_are_literal_unless_interpolating(shell):
    shell.user_ns["x"] = "a much longer replacement text"
    literal = run(shell, "tiny -n 1 --no-stream", "{x}")
    expanded = run(shell, "tiny -n 1 --no-stream -i", "{x}")
    assert expanded.metrics.prompt_eval_count > literal.metrics.prompt_eval_count


def test_default_model_from_config(shell):
    shell.run_line_magic("config", "LLMMagics.default_model = 'tiny'")
    assert run(shell, "-n 2").metrics.model == "tiny"


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("nope -n 1", "x", "Error: model 'nope:latest' not found"),
        ("tiny -f missing", "x", "Error: -f: 'missing' is neither 'json' nor a variable"),
        ("tiny -i", "{undefined}", "Error: -i: 'undefined' is not defined"),
        ("tiny -t hot", "x", "Error: argument -t/--temperature: invalid float value: 'hot'"),
        ("tiny -f bad", "x", 'Error: invalid format: {"type": "nonsense"}'),
    ],
)
def test_errors_are_one_red_line(shell, capsys, line, cell, message):
    shell.user_ns["bad"] = {"type": "nonsense"}
    assert run(shell, line, cell) is None
    out = capsys.readouterr().out
    assert message in out and "Traceback" not in out


def test_line_commands(shell, capsys, tmp_path, demo_gguf):
    shell.run_line_magic("llm", "models")
    assert "tiny:latest" in capsys.readouterr().out
    (tmp_path / "Modelfile").write_text("FROM tiny\nPARAMETER num_predict 2\n")
    shell.run_line_magic("llm", f"create brief {tmp_path / 'Modelfile'}")
    shell.run_line_magic("llm", "show brief")
    assert "num_predict" in capsys.readouterr().out
    run(shell, "brief")
    shell.run_line_magic("llm", "ps")
    assert "brief:latest" in capsys.readouterr().out
    shell.run_line_magic("llm", "unload --all")
    assert "unloaded 'brief:latest'" in capsys.readouterr().out
    shell.run_line_magic("llm", "rm brief")
    shell.run_line_magic("llm", "bogus")
    assert "unknown command 'bogus'" in capsys.readouterr().out
    shell.run_line_magic("llm", "help")
    assert "%%llm MODEL" in capsys.readouterr().out


def test_dashboard_shows_simulated_devices_and_unloads(live, shell):
    engine = Engine(live.url, live.token, "env")
    run(shell, "tiny -n 1")
    dash = DeviceDashboard(engine, start=False)
    dash.refresh()
    rows = [r.value for r in dash.device_rows.children]
    assert "RTX Sim · CUDA" in rows[0] and "tiny:latest weights" in rows[0]
    assert "System RAM" in rows[-1]
    (model_row,) = dash.model_rows.children
    button, info = model_row.children
    assert "tiny:latest" in info.value and "unloads in" in info.value
    button.click()  # calls the API
    assert engine.request("GET", "api/ps")["models"] == []
    assert "No model is loaded" in dash.model_rows.children[0].value
    dash.close()


def test_dashboard_thread_stops_when_closed(live):
    dash = DeviceDashboard(Engine(live.url, live.token, "env"), interval=0.05)
    assert dash._thread.is_alive()
    dash.close()
    dash._thread.join(2)
    assert not dash._thread.is_alive()


def test_embedded_mode(tmp_path, demo_gguf, monkeypatch):
    from jupyter_llm.kernel import connection

    store = ModelStore(tmp_path / "models")
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    for var in ("JUPYTER_LLM_URL", "JUPYTER_LLM_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JUPYTER_LLM_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    ip = InteractiveShell.instance()
    magics = LLMMagics(shell=ip)
    ip.register_magics(magics)
    try:
        g = ip.run_cell_magic("llm", "tiny -n 3 --no-stream", "hello")
        assert magics.engine.kind == "embedded" and g.metrics.eval_count == 3
        assert "tiny:latest" in [m.model for m in magics.engine.ollama_client().list().models]
    finally:
        connection.stop_embedded()


def test_quickstart_notebook_runs_end_to_end(live, demo_gguf, monkeypatch):
    import ast

    import nbformat
    from nbclient import NotebookClient

    store = ModelStore(live.env["JUPYTER_LLM_MODELS"])
    store.copy("tiny", "demo")
    monkeypatch.setenv("JUPYTER_LLM_URL", live.url)
    monkeypatch.setenv("JUPYTER_LLM_TOKEN", live.token)
    nb = nbformat.read("examples/quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()  # raises on any error
    outputs = {i: c.get("outputs", []) for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    texts = json.dumps(outputs)
    assert "Error:" not in texts
    haiku = next(
        o
        for c in nb.cells
        if "haiku" in c.source
        for o in c.outputs
        if o.get("output_type") == "execute_result"
    )
    assert "demo · 40 tokens" in haiku["data"]["text/markdown"]
    someone = next(c for c in nb.cells if c.source == "someone").outputs[0]
    assert {"name", "age"} <= set(ast.literal_eval(someone["data"]["text/plain"]))
    talk = next(c for c in nb.cells if c.source == "len(talk.messages)").outputs[0]
    assert talk["data"]["text/plain"] == "4"


def test_interrupt_cancels_generation_on_the_server(shell, live):
    import os
    import signal
    import threading
    import time

    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    g = run(shell, "tiny -n 1000000 -t 0", "go on forever")
    assert time.monotonic() - started < 30
    assert g.metrics.done_reason == "cancel" and "interrupted" in g.metrics.footer()
    for _ in range(50):  # the server notices the closed stream within a token or so
        first = live.client.get("api/ps").json()["models"][0]["expires_at"]
        time.sleep(0.1)
        if live.client.get("api/ps").json()["models"][0]["expires_at"] == first:
            break  # the keep_alive timer runs: the request was released
    else:
        pytest.fail("the runner was not released after the interrupt")


def test_pull_line_command_with_progress_bar(shell, capsys, demo_gguf):
    from loopback import LoopbackServer, Remote

    remote = Remote()
    remote.add_model("library", "pulled", "latest", demo_gguf.read_bytes())
    server = LoopbackServer(remote)
    try:
        shell.run_line_magic("llm", f"pull {server.host}/library/pulled --insecure")
    finally:
        server.close()
    out = capsys.readouterr().out
    assert "HBox" in out and "Error" not in out  # the progress widget was displayed
    shell.run_line_magic("llm", "models")
    assert f"{server.host}/library/pulled:latest" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "servers", "expected"),
    [
        (
            {"JUPYTER_LLM_URL": "http://h:1/base", "JUPYTER_LLM_TOKEN": "t"},
            [],
            ("http://h:1/base/", "t", "env"),
        ),
        (
            {"JPY_PARENT_PID": "22"},
            [
                {"pid": 11, "url": "http://a/", "token": "x"},
                {"pid": 22, "url": "http://b/", "token": "y"},
            ],
            ("http://b/", "y", "server"),
        ),
        ({}, [{"pid": 11, "url": "http://a/", "token": "x"}], ("http://a/", "x", "server")),
    ],
)
def test_find_engine_order(monkeypatch, env, servers, expected):
    from jupyter_llm.kernel import connection

    for var in ("JUPYTER_LLM_URL", "JUPYTER_LLM_TOKEN", "JPY_PARENT_PID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(connection, "_running_servers", lambda: servers)
    monkeypatch.setattr(connection, "_has_extension", lambda info: True)
    engine = connection.find_engine(embedded=False)
    assert (engine.url, engine.token, engine.kind) == expected


def test_find_engine_without_servers_and_embedding_off(monkeypatch):
    from jupyter_llm.kernel import connection

    monkeypatch.delenv("JUPYTER_LLM_URL", raising=False)
    monkeypatch.setattr(
        connection,
        "_running_servers",
        lambda: [{"pid": 1, "url": "http://a/"}, {"pid": 2, "url": "http://b/"}],
    )
    monkeypatch.setattr(connection, "_has_extension", lambda info: True)
    with pytest.raises(connection.LLMClientError, match="set JUPYTER_LLM_URL"):
        connection.find_engine(embedded=False)
