"""The notebook side: magics through an IPython shell, the dashboard widget,
results, and embedded mode."""

from __future__ import annotations

import io
import json

import pytest
from IPython.core.interactiveshell import InteractiveShell
from live_server import LiveServer
from waiting import iopub_until, until_sync

from jupyter_llm.connect import ServerEndpoint
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
    env = {
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(SIMULATED),
        # its jpserver-<pid>.json stays out of the runtime dir other clients search
        "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("kernel-runtime")),
    }
    server = LiveServer(models, models, env)
    yield server
    server.stop()


@pytest.fixture
def shell(live):
    ip = InteractiveShell.instance()
    magics = LLMMagics(shell=ip, endpoint=ServerEndpoint(live.url, live.token, "env"))
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


def test_format_from_a_pydantic_model_with_bounds(shell):
    # Field(ge=...) makes "minimum", once refused; now enforced by the grammar
    pydantic = pytest.importorskip("pydantic")

    class Reading(pydantic.BaseModel):
        value: int = pydantic.Field(ge=0, le=99)
        unit: str = pydantic.Field(pattern="^(m|s|kg)$")

    shell.user_ns["Reading"] = Reading
    g = run(shell, "tiny -f Reading --seed 3 -n 60")
    assert isinstance(g.data, Reading) and 0 <= g.data.value <= 99


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
        ("tiny --image nowhere", "x", "Error: --image: 'nowhere' is not defined"),
        ("tiny --image bad", "x", "Error: --image bad is a dict; give a PIL image"),
        ("tiny --image path", "x", "Error: --image path: no file 'no-such.png'"),
        ("tiny --image text", "x", "Error: --image text: the bytes are not an image file"),
        # a real PNG to a model without a projector: the server's 400, as one line
        ("tiny --image png", "x", "Error: model 'tiny:latest' does not support images"),
        ("tiny --map words --image bad", "x", "Error: --image bad is a dict; give"),
    ],
)
def test_errors_are_one_red_line(shell, capsys, line, cell, message):
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, format="PNG")
    shell.user_ns.update(
        bad={"type": "nonsense"},
        path="no-such.png",
        text=b"hello",
        png=png.getvalue(),
        words=["a"],
    )
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
    endpoint = ServerEndpoint(live.url, live.token, "env")
    run(shell, "tiny -n 1")
    dash = DeviceDashboard(endpoint, start=False)
    dash.refresh()
    rows = [r.value for r in dash.device_rows.children]
    assert "RTX Sim · CUDA" in rows[0] and "tiny:latest weights" in rows[0]
    assert "System RAM" in rows[-1]
    (model_row,) = dash.model_rows.children
    button, info = model_row.children
    assert "tiny:latest" in info.value and "unloads in" in info.value
    button.click()  # calls the API
    assert endpoint.request("GET", "api/ps")["models"] == []
    assert "No model is loaded" in dash.model_rows.children[0].value
    dash.close()


def test_a_model_on_the_cpu_shows_its_threads_in_its_row():
    """As the sidebar: the count as its last request ended (threads_label)."""
    dash = DeviceDashboard(ServerEndpoint("http://127.0.0.1:9", "t", "env"), start=False)
    model = {"name": "tiny:latest", "size": 2**20, "size_vram": 0, "context_length": 2048}
    model["expires_at"] = "2318-01-01T00:00:00Z"  # Ollama's "kept loaded"
    for threads, shown in (({"now": 1, "loaded": 2, "adaptive": True}, "1 of 2 threads"), (
        {"now": 2, "loaded": 2, "adaptive": True}, "2 threads"
    )):  # fmt: skip
        _, info = dash._model_row({**model, "threads": threads}).children
        assert info.value.endswith(f"100% CPU · ctx 2048 · {shown} · kept loaded")
    _, info = dash._model_row(model).children  # an older server: no threads
    assert info.value.endswith("100% CPU · ctx 2048 · kept loaded")
    dash.close()


def test_dashboard_thread_stops_when_closed(live):
    dash = DeviceDashboard(ServerEndpoint(live.url, live.token, "env"), interval=0.05)
    assert dash._thread.is_alive()
    dash.close()
    dash._thread.join(30)  # a deadline: the thread ends within one interval
    assert not dash._thread.is_alive()


def test_embedded_mode(tmp_path, demo_gguf, monkeypatch):
    from jupyter_llm.connect import embedded

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
        assert magics.endpoint.kind == "embedded" and g.metrics.eval_count == 3
        assert "tiny:latest" in [m.model for m in magics.endpoint.ollama_client().list().models]
    finally:
        embedded.stop_embedded()


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


# -- the stop button: SIGINT to a real kernel ---------------------------------------------
LONG_CTX = 1 << 16  # tokens: far more decode steps than any machine does in the test's time


@pytest.fixture(scope="module")
def endless(live, tmp_path_factory):
    """``long``: the demo model with a 64k-token context, so a generation with
    ``num_predict -1`` cannot end (at the context limit) before it is
    interrupted, however fast the machine."""
    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    path = write_demo_model(
        tmp_path_factory.mktemp("long") / "long.gguf", DemoModelSpec(context_length=LONG_CTX)
    )
    store = ModelStore(live.env["JUPYTER_LLM_MODELS"])
    store.create("long", {"long.gguf": store.add_blob_from_file(path)})
    yield "long:latest"
    live.client.post("api/generate", json={"model": "long", "keep_alive": 0})


def in_use(live, name: str) -> bool:
    """The server's own view: a loaded model with a request in flight has no
    keep_alive timer, so its ``expires_at`` moves with every ``/api/ps``; once
    released, the timer fixes it."""

    def expires() -> str | None:
        models = live.client.get("api/ps").json()["models"]
        return next((m["expires_at"] for m in models if m["name"] == name), None)

    first = expires()
    return first is not None and expires() != first


def interrupt(process) -> None:
    """SIGINT to ``process`` alone (not a group), only while it is still the
    child we started: same pid and start time, not reaped, not this runner."""
    import os
    import signal

    import psutil

    assert process.pid not in (os.getpid(), os.getpgrp())
    assert process.is_running(), "the kernel died before the interrupt"  # checks create_time
    assert process.ppid() == os.getpid()  # our unreaped child: its pid cannot be reused
    try:
        process.send_signal(signal.SIGINT)  # psutil re-checks the pid's identity
    except psutil.NoSuchProcess:
        pytest.fail("the kernel died before the interrupt")


def test_interrupt_cancels_generation_on_the_server(live, endless):
    """The stop button: a kernel interrupted mid-stream closes the connection
    and the server releases the runner."""
    import psutil
    from kernels import running_kernel

    with running_kernel(live.client_env) as (km, kc):
        kernel = psutil.Process(km.provisioner.process.pid)  # pins pid and create_time
        reply = kc.execute_interactive("%load_ext jupyter_llm", timeout=60)
        assert reply["content"]["status"] == "ok"
        cell = f"%%llm long -n -1 --num-ctx {LONG_CTX} -t 0\ngo on forever"
        msg_id = kc.execute(cell)

        def tokens_shown(msg: dict) -> bool:
            text = msg["content"].get("data", {}).get("text/markdown", "")
            shown = text not in ("", "…") and not text.startswith("*loading ")  # not the load
            return msg["msg_type"] == "update_display_data" and shown

        iopub_until(kc, msg_id, tokens_shown, 60, "the first streamed tokens")
        assert in_use(live, endless), "the generation is not running on the server"
        interrupt(kernel)
        result = iopub_until(
            kc, msg_id, lambda m: m["msg_type"] == "execute_result", 30, "the cell's result"
        )
        assert "interrupted" in result["content"]["data"]["text/markdown"]
        until_sync(lambda: not in_use(live, endless), 20, "the server to release the runner")


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


# -- which server: the discovery order, as a table ---------------------------------------
NOT_A_PID_A, NOT_A_PID_B = 5_000_001, 5_000_002  # above Linux's pid_max: never our parent
A = {"pid": NOT_A_PID_A, "url": "http://a/", "token": "x", "root_dir": "/home/a"}
B = {"pid": NOT_A_PID_B, "url": "http://b/", "token": "y", "root_dir": "/srv/b"}
PARENT = {"pid": "PPID", "url": "http://p/", "token": "z", "root_dir": "/p"}
EMBEDDED = ServerEndpoint("http://127.0.0.1:1/", "e", "embedded")


@pytest.mark.parametrize(
    ("env", "servers", "with_llm", "embedded", "expected"),
    [
        pytest.param(
            {"JUPYTER_LLM_URL": "http://h:1/base", "JUPYTER_LLM_TOKEN": "t"},
            [A, B],
            "ab",
            True,
            ("http://h:1/base/", "t", "env"),
            id="the environment wins",
        ),
        pytest.param(
            {"JPY_PARENT_PID": str(NOT_A_PID_B)},
            [A, B],
            "ab",
            True,
            ("http://b/", "y", "server"),
            id="the kernel's server (JPY_PARENT_PID) among several",
        ),
        pytest.param(
            {}, [A, PARENT], "ap", True, ("http://p/", "z", "server"), id="the parent process"
        ),
        pytest.param({}, [A], "a", False, ("http://a/", "x", "server"), id="the only server"),
        pytest.param(
            {},
            [A, B],
            "b",
            True,
            ("http://b/", "y", "server"),
            id="the only one with jupyter-llm",
        ),
        pytest.param(
            {}, [A, B], "ab", True, "several", id="several, none the parent: no second engine"
        ),
        pytest.param({}, [A, B], "ab", False, "several", id="several, embedding off"),
        pytest.param(
            {"JPY_PARENT_PID": str(NOT_A_PID_A)},
            [B],
            "b",
            True,
            ("http://b/", "y", "server"),
            id="parent gone, one other server",
        ),
        pytest.param({}, [], "", True, ("http://127.0.0.1:1/", "e", "embedded"), id="none runs"),
        pytest.param(
            {},
            [A, B],
            "",
            True,
            ("http://127.0.0.1:1/", "e", "embedded"),
            id="none has the extension",
        ),
        pytest.param({}, [], "", False, "none", id="none runs, embedding off"),
    ],
)
def test_find_server(monkeypatch, env, servers, with_llm, embedded, expected):
    import os

    from jupyter_llm.connect import discovery
    from jupyter_llm.connect import embedded as embedding

    for var in ("JUPYTER_LLM_URL", "JUPYTER_LLM_TOKEN", "JPY_PARENT_PID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    servers = [{**s, "pid": os.getppid() if s["pid"] == "PPID" else s["pid"]} for s in servers]
    monkeypatch.setattr(discovery, "_running_servers", lambda: servers)
    # with_llm: the hosts (a, b, p) whose /llm/api/version answers
    monkeypatch.setattr(discovery, "_has_extension", lambda info: info["url"][7] in with_llm)
    monkeypatch.setattr(embedding, "start_embedded", lambda: EMBEDDED)
    if expected == "several":
        with pytest.raises(discovery.SeveralServersError) as raised:
            discovery.find_server(embedded=embedded)
        message = str(raised.value)
        for s in servers:
            assert f"{s['url']}  pid {s['pid']}  root {s['root_dir']}" in message
        assert "JUPYTER_LLM_URL" in message and "JUPYTER_LLM_TOKEN" in message
    elif expected == "none":
        with pytest.raises(discovery.LLMClientError, match="no running Jupyter server"):
            discovery.find_server(embedded=embedded)
    else:
        endpoint = discovery.find_server(embedded=embedded)
        assert (endpoint.url, endpoint.token, endpoint.kind) == expected


def test_dashboard_shows_notices_escaped():
    from jupyter_llm.kernel.widgets import notices_html

    assert notices_html([]) == ""
    out = notices_html(
        [{"kind": "idle_gpu", "message": "1 GPU(s) <b>", "fix": "make lab GPU=cuda"}]
    )
    assert "&lt;b&gt;" in out and "<code>make lab GPU=cuda</code>" in out


@pytest.fixture(scope="module")
def idle_gpu_live(tmp_path_factory):
    models = tmp_path_factory.mktemp("idle-models")
    env = {
        "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("idle-runtime")),
        "JUPYTER_LLM_SIMULATED_HOST_GPUS": '[{"vendor": "other", "name": "Radeon"}]',
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(
            [{"id": "cpu", "library": "CPU", "name": "CPU", "total_memory": 8, "free_memory": 8}]
        ),
    }
    server = LiveServer(models, models, env)
    yield server
    server.stop()


def test_llm_devices_explains_an_idle_gpu(idle_gpu_live):
    ip = InteractiveShell.instance()
    endpoint = ServerEndpoint(idle_gpu_live.url, idle_gpu_live.token, "env")
    ip.register_magics(LLMMagics(shell=ip, endpoint=endpoint))
    dash = ip.run_line_magic("llm", "devices")
    assert isinstance(dash, DeviceDashboard)
    assert "Radeon" in dash.notices.value and "make lab GPU=vulkan" in dash.notices.value
    dash.close()


def test_agents_and_vision_notebook_runs_end_to_end(live, monkeypatch, tmp_path):
    """examples/agents_and_vision.ipynb on generated models: the agent model
    carries Qwen's template (its tool calls are grammar-held), the vision
    model a random-weight projector."""
    import nbformat
    from nbclient import NotebookClient

    from jupyter_llm.chat_formats import read_template
    from jupyter_llm.demo import DemoModelSpec, write_demo_model, write_vision_model

    store = ModelStore(live.env["JUPYTER_LLM_MODELS"])
    spec = DemoModelSpec(chat_template=read_template("Qwen-Qwen2.5-7B-Instruct"))
    agent = write_demo_model(tmp_path / "agent.gguf", spec)
    store.create("agent", {"agent.gguf": store.add_blob_from_file(agent)})
    model, projector = write_vision_model(tmp_path, "seer")
    files = {p.name: store.add_blob_from_file(p) for p in (model, projector)}
    store.create("seer", files)
    monkeypatch.setenv("JUPYTER_LLM_URL", live.url)
    monkeypatch.setenv("JUPYTER_LLM_TOKEN", live.token)
    monkeypatch.setenv("AGENT_MODEL", "agent")
    monkeypatch.setenv("VISION_MODEL", "seer")
    nb = nbformat.read("examples/agents_and_vision.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()  # raises on any error
    assert "Error:" not in json.dumps([c.get("outputs", []) for c in nb.cells])

    def value(source: str) -> str:
        cell = next(c for c in nb.cells if c.source == source)
        return next(o for o in cell.outputs if o["output_type"] == "execute_result")["data"]

    calls = value("calls_made")["text/plain"]
    assert calls.startswith("[(") and ("'add'" in calls or "'multiply'" in calls)
    seen = next(c for c in nb.cells if "--image fig" in c.source)
    shown = [o for o in seen.outputs if o["output_type"] == "execute_result"]
    assert "seer · 60 tokens" in shown[0]["data"]["text/markdown"]
    usage = next(c for c in nb.cells if c.source.endswith("response.usage"))
    printed = [o for o in usage.outputs if o["output_type"] == "execute_result"]
    assert "completion_tokens=60" in printed[0]["data"]["text/plain"]


@pytest.fixture(scope="module")
def seer(live, tmp_path_factory):
    """``seer``: a generated vision model (random-weight projector)."""
    from jupyter_llm.demo import write_vision_model

    model, projector = write_vision_model(tmp_path_factory.mktemp("seer"), "seer")
    store = ModelStore(live.env["JUPYTER_LLM_MODELS"])
    store.create("seer", {p.name: store.add_blob_from_file(p) for p in (model, projector)})
    yield "seer"
    live.client.post("api/generate", json={"model": "seer", "keep_alive": 0})


def test_images_reach_a_vision_model_from_the_magic(shell, seer, tmp_path):
    """Each --image adds the image's tokens to the prompt; the chat keeps
    the images in its history, as Ollama's clients do."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(2, 2), dpi=40)
    ax.plot([0, 1], [1, 0])
    photo = tmp_path / "photo.png"
    Image.new("RGB", (32, 32), (10, 200, 10)).save(photo)
    shell.user_ns.update(fig=fig, photo=photo, pil=Image.new("L", (16, 16), 99))
    plain = run(shell, "seer -n 2 --no-stream", "Describe it.")
    one = run(shell, "seer -n 2 --no-stream --image fig", "Describe it.")
    two = run(shell, "seer -n 2 --no-stream --image fig --image photo --chat look", "Describe.")
    assert plain.metrics.prompt_eval_count < one.metrics.prompt_eval_count
    assert one.metrics.prompt_eval_count < two.metrics.prompt_eval_count
    talk = shell.user_ns["look"]
    assert len(talk.messages[0]["images"]) == 2
    again = run(shell, "--chat look -n 2 --no-stream --image pil", "And this one?")
    assert again.metrics.eval_count == 2 and len(talk.messages) == 4
    assert len(talk.messages[2]["images"]) == 1
    plt.close(fig)
