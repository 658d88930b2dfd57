"""``jupyter_llm.map`` and the load progress clients show, against a real
server and real runners on generated models: order, per-item formats, a
failing item, the slots ``/api/ps`` reports, the stop button in a real
kernel, and a load's progress seen by each client before its first token (a
runner whose load pauses until the test has seen the progress)."""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell
from live_server import LiveServer

import jupyter_llm
from jupyter_llm.connect import LLMClientError, ServerEndpoint
from jupyter_llm.connect.loading import LoadWatcher, load_progress, parallel_of
from jupyter_llm.kernel.batch import Item, MapError, MapResults, request_body, summarize, to_items
from jupyter_llm.kernel.magics import LLMMagics, parse_cell_args
from jupyter_llm.models.store import ModelStore


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    """Two slots per model (``num_parallel`` 2)."""
    models = tmp_path_factory.mktemp("map-models")
    store = ModelStore(models)
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    env = {
        "JUPYTER_LLM_NUM_PARALLEL": "2",
        "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("map-runtime")),
    }
    server = LiveServer(models, models, env)
    yield server
    server.stop()


@pytest.fixture
def endpoint(live) -> ServerEndpoint:
    return ServerEndpoint(live.url, live.token, "env")


# -- pure ---------------------------------------------------------------------------------
def test_to_items_and_request_bodies():
    items = to_items(["a", {"prompt": "b", "system": "s2", "options": {"seed": 1}}])
    assert items == [Item("a"), Item("b", "s2", {"seed": 1})]
    path, body = request_body(
        "m", items[1], mode="chat", system="s1", options={"seed": 0, "top_k": 3},
        fmt="json", keep_alive="1m",
    )  # fmt: skip
    assert path == "api/chat" and body == {
        "model": "m",
        "stream": False,
        "options": {"seed": 1, "top_k": 3},
        "messages": [{"role": "system", "content": "s2"}, {"role": "user", "content": "b"}],
        "format": "json",
        "keep_alive": "1m",
        "priority": "batch",  # map() is batch work: interactive requests go first
    }
    path, body = request_body(
        "m", items[0], mode="generate", system="s1", options={}, fmt=None, keep_alive=None
    )
    assert path == "api/generate" and body == {
        "model": "m", "stream": False, "options": {}, "prompt": "a", "system": "s1",
        "priority": "batch",
    }  # fmt: skip
    _, body = request_body(
        "m", items[0], mode="generate", system=None, options={}, fmt=None, keep_alive=None,
        priority="interactive",
    )  # fmt: skip
    assert body["priority"] == "interactive"


@pytest.mark.parametrize(
    "prompts",
    [[1], [{"text": "x"}], [{"prompt": "x", "extra": 1}], [{"prompt": "x", "options": 3}]],
)
def test_bad_items_are_a_type_error_naming_the_item(prompts):
    with pytest.raises(TypeError, match="item 0"):
        to_items(prompts)


def test_summary():
    values = ["a", MapError(1, "boom"), MapError(2, "cancelled", cancelled=True), "d"]
    assert summarize(values) == "4 items: 2 done, 1 failed, 1 cancelled; item 1: boom"
    assert summarize(["a"]) == "1 items: 1 done"


def test_ps_readers():
    ps = {
        "models": [{"name": "tiny:latest", "parallel": 4}, {"name": "old:latest"}],
        "loading": [{"name": "big:latest", "progress": 0.5}],
    }
    assert parallel_of(ps, "tiny") == 4 and parallel_of(ps, "old") == 1
    assert parallel_of(ps, "big") is None
    assert load_progress(ps, "big") == 0.5 and load_progress(ps, "tiny") is None
    assert load_progress({"models": []}, "big") is None  # an older server


def test_map_cell_args():
    a = parse_cell_args("tiny --map xs --concurrency 3 -o out")
    assert (a.map, a.concurrency, a.out) == ("xs", 3, "out")


# -- against the server ----------------------------------------------------------------------
def test_ps_reports_slots_and_map_uses_them(live, endpoint):
    results = jupyter_llm.map(
        "tiny", ["Say hello"], options={"num_predict": 2}, progress=False, endpoint=endpoint
    )
    ps = live.client.get("api/ps").json()
    assert ps["loading"] == []
    assert [m["parallel"] for m in ps["models"] if m["name"] == "tiny:latest"] == [2]
    assert results.concurrency == 2
    forced = jupyter_llm.map(
        "tiny", ["x"], options={"num_predict": 1}, concurrency=1, progress=False, endpoint=endpoint
    )
    assert forced.concurrency == 1


def test_order_kept_and_a_failing_item_loses_nothing(endpoint, capsys):
    """Greedy, same prompt, item i stops after i + 1 tokens: each text is the
    previous one plus more, so any reordering shows. Item 3 has a bad option."""
    prompts = [{"prompt": "Say hello", "options": {"num_predict": i + 1}} for i in range(6)]
    prompts[3] = {"prompt": "Say hello", "options": {"temperature": "hot"}}
    results = jupyter_llm.map(
        "tiny", prompts, options={"temperature": 0}, progress=io.StringIO(), endpoint=endpoint
    )
    assert isinstance(results, MapResults) and len(results) == 6
    assert list(results.errors) == [3] and "temperature" in results[3].message
    assert not results[3].cancelled and results.metrics[3] is None
    texts = [r for i, r in enumerate(results) if i != 3]
    counts = [m.eval_count for i, m in enumerate(results.metrics) if i != 3]
    assert counts == [1, 2, 3, 5, 6]
    assert all(b.startswith(a) and len(b) > len(a) for a, b in itertools.pairwise(texts))
    assert "map: 6 items: 5 done, 1 failed; item 3:" in capsys.readouterr().err


def test_per_item_schema_and_pydantic_models(endpoint):
    import jsonschema

    pydantic = pytest.importorskip("pydantic")
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
    }
    prompts = ["one", "two", "three"]
    options = {"seed": 3, "num_predict": 200}
    data = jupyter_llm.map(
        "tiny", prompts, format=schema, options=options, progress=False, endpoint=endpoint
    )
    for value in data:
        jsonschema.validate(value, schema)

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=8)
        ok: bool

    cities = jupyter_llm.map(
        "tiny", prompts, format=City, options=options, mode="generate", progress=False,
        endpoint=endpoint,
    )  # fmt: skip
    assert all(isinstance(c, City) for c in cities)


def test_an_output_that_does_not_match_the_format_is_that_items_error(endpoint):
    """Cut off after 3 tokens, the JSON cannot be complete."""
    results = jupyter_llm.map(
        "tiny", ["a", "b"], format="json", options={"num_predict": 3}, progress=False,
        endpoint=endpoint,
    )  # fmt: skip
    assert all(
        isinstance(r, MapError) and "does not match the format" in r.message for r in results
    )


def test_a_series_comes_back_with_its_index(endpoint):
    pandas = pytest.importorskip("pandas")
    prompts = pandas.Series(["a", "b"], index=["x", "y"], name="q")
    results = jupyter_llm.map(
        "tiny", prompts, options={"num_predict": 1}, progress=False, endpoint=endpoint
    )
    assert list(results.index) == ["x", "y"] and results.name == "q"
    assert all(isinstance(v, str) for v in results)


def test_a_model_that_does_not_exist_fails_the_whole_call(endpoint):
    with pytest.raises(LLMClientError, match="not found"):
        jupyter_llm.map("nope", ["a"], progress=False, endpoint=endpoint)
    assert jupyter_llm.map("tiny", [], endpoint=endpoint) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "complete"}, "mode"),
        ({"concurrency": 0}, "concurrency"),
        ({"priority": "urgent"}, "priority"),
    ],
)
def test_bad_arguments(endpoint, kwargs, message):
    with pytest.raises(ValueError, match=message):
        jupyter_llm.map("tiny", ["a"], endpoint=endpoint, **kwargs)
    with pytest.raises(TypeError, match="pydantic"):
        jupyter_llm.map("tiny", ["a"], format=3, endpoint=endpoint)


def test_map_cell_magic(live, capsys):
    ip = InteractiveShell.instance()
    ip.register_magics(LLMMagics(shell=ip, endpoint=ServerEndpoint(live.url, live.token, "env")))
    try:
        ip.user_ns["words"] = ["rain", "snow", "sun"]
        results = ip.run_cell_magic(
            "llm", "tiny --map words -n 2 -t 0 -o poems --no-stream", "A poem about {item}."
        )
        assert results == ip.user_ns["poems"] and len(results) == 3
        assert all(isinstance(r, str) and r for r in results)
        single = ip.run_cell_magic("llm", "tiny -n 2 -t 0 --no-stream", "A poem about snow.")
        assert results[1] == single.text  # the template filled with the second word
        ip.user_ns["rows"] = [{"w": "rain"}]
        rows = ip.run_cell_magic("llm", "tiny --map rows -n 2 -t 0 -i --no-stream", "{item[w]}")
        assert rows == [ip.run_cell_magic("llm", "tiny -n 2 -t 0 --no-stream", "rain").text]
        for line, message in [
            ("tiny --map missing", "'missing' is not defined"),
            ("tiny --map words --chat c", "do not go together"),
            ("tiny --map text", "must be a list or a Series"),
        ]:
            ip.user_ns["text"] = "a string"
            assert ip.run_cell_magic("llm", line, "{item}") is None
            assert message in capsys.readouterr().out
        ip.run_line_magic("llm", "help")
        assert "--map VAR" in capsys.readouterr().out
    finally:
        ip.user_ns.clear()


# -- the stop button: SIGINT to a real kernel --------------------------------------------------
def test_interrupt_cancels_every_request_and_keeps_what_finished(gated, tmp_path):
    """One short generation, then three endless ones, one at a time on a model
    with one slot: after the short one finished, the stop button closes the
    requests, the server cancels them, and the model serves a new request."""
    import psutil
    from kernels import running_kernel
    from test_kernel import LONG_CTX, in_use, interrupt
    from waiting import iopub_until, until_sync

    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    gated.gate.touch()  # loads do not pause here
    path = write_demo_model(tmp_path / "long.gguf", DemoModelSpec(context_length=LONG_CTX))
    store = ModelStore(gated.env["JUPYTER_LLM_MODELS"])
    store.create("long", {"long.gguf": store.add_blob_from_file(path)})
    try:
        with running_kernel(gated.client_env) as (km, kc):
            kernel = psutil.Process(km.provisioner.process.pid)
            code = (
                "import jupyter_llm\n"
                "prompts = [{'prompt': 'short', 'options': {'num_predict': 2}}]"
                " + ['go on forever'] * 3\n"
                "r = jupyter_llm.map('long', prompts, progress=False,"
                " on_result=lambda i, v: print('FINISHED', i, flush=True),"
                f" options={{'num_predict': -1, 'num_ctx': {LONG_CTX}, 'temperature': 0}})\n"
                "print('RESULT', [type(x).__name__ for x in r], [getattr(x, 'cancelled', None)"
                " for x in r], r.concurrency)"
            )
            msg_id = kc.execute(code)

            def printed(text: str):
                return lambda m: m["msg_type"] == "stream" and text in m["content"]["text"]

            iopub_until(kc, msg_id, printed("FINISHED 0"), 60, "the short item")
            until_sync(lambda: in_use(gated, "long:latest"), 60, "the next generation to run")
            interrupt(kernel)
            out = iopub_until(kc, msg_id, printed("RESULT"), 60, "map's results")
            assert (
                "['str', 'MapError', 'MapError', 'MapError'] [None, True, True, True] 1"
                in (out["content"]["text"])
            )
            # one slot: a new request completes only once every endless one was cancelled
            reply = gated.client.post(
                "api/generate",
                json={"model": "long", "prompt": "hi", "stream": False,
                      "options": {"num_predict": 1, "num_ctx": LONG_CTX}},
                timeout=60,
            )  # fmt: skip
            assert reply.status_code == 200 and reply.json()["done"]
            until_sync(lambda: not in_use(gated, "long:latest"), 20, "the server to release it")
    finally:
        gated.client.post("api/generate", json={"model": "long", "keep_alive": 0})


# -- load progress, seen before the first token --------------------------------------------------
@pytest.fixture(scope="module")
def gated(tmp_path_factory, demo_gguf):
    """A server (one slot per model) whose runners pause their load at its
    first progress value until ``gate`` exists."""
    root = tmp_path_factory.mktemp("gated")
    store = ModelStore(root / "models")
    store.create("tiny", {"t.gguf": store.add_blob_from_file(demo_gguf)})
    script = Path(__file__).parents[1] / "support" / "slow_load_runner.py"
    python = root / "slow-load-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    gate = root / "gate"
    env = {
        "JUPYTER_LLM_NUM_PARALLEL": "1",  # the stop-button test relies on one slot
        "JUPYTER_LLM_PYTHON": str(python),
        "JUPYTER_LLM_TEST_LOAD_GATE": str(gate),
        "JUPYTER_RUNTIME_DIR": str(root),
    }
    server = LiveServer(root / "models", root, env)
    server.gate = gate
    yield server
    server.stop()


@pytest.fixture
def gate(gated):
    """Closed, with the model unloaded: the next request loads it and pauses."""
    gated.gate.unlink(missing_ok=True)
    gated.client.post("api/generate", json={"model": "tiny", "keep_alive": 0})
    yield gated.gate
    gated.gate.touch()  # never leave a load paused


def is_partial(text: str) -> bool:
    """``loading tiny: N%`` with 0 < N < 100 in ``text``."""
    import re

    return any(0 < int(n) < 100 for n in re.findall(r"loading tiny: (\d+)%", text))


def test_ps_lists_a_loading_model_and_the_watcher_sees_it(gated, gate):
    seen: list[float] = []

    def show(fraction: float) -> None:
        seen.append(fraction)
        if 0 < fraction < 1:
            gate.touch()

    endpoint = ServerEndpoint(gated.url, gated.token, "env")
    with LoadWatcher(endpoint, "tiny", show):
        reply = endpoint.request(
            "POST", "api/generate", {"model": "tiny", "prompt": "hi", "stream": False,
                                     "options": {"num_predict": 1}},
        )  # fmt: skip
    assert reply["done"] and any(0 < f < 1 for f in seen)
    assert gated.client.get("api/ps").json()["loading"] == []


def test_map_shows_the_load_progress(gated, gate):
    class Bar(io.StringIO):
        def write(self, text: str) -> int:
            if is_partial(text):
                gate.touch()
            return super().write(text)

    bar = Bar()
    endpoint = ServerEndpoint(gated.url, gated.token, "env")
    results = jupyter_llm.map("tiny", ["a"], options={"num_predict": 1}, progress=bar,
                              endpoint=endpoint)  # fmt: skip
    assert isinstance(results[0], str) and is_partial(bar.getvalue())


def test_cell_magic_shows_the_load_progress(gated, gate):
    class Publisher(DisplayPublisher):
        shown: list[str] = []

        def publish(self, data, metadata=None, *args, **kwargs) -> None:
            text = data.get("text/markdown", "")
            self.shown.append(text)
            if is_partial(text):
                gate.touch()

    ip = InteractiveShell.instance()
    saved, ip.display_pub = ip.display_pub, Publisher(shell=ip)
    try:
        ip.register_magics(
            LLMMagics(shell=ip, endpoint=ServerEndpoint(gated.url, gated.token, "env"))
        )
        g = ip.run_cell_magic("llm", "tiny -n 1", "hi")
        assert g.metrics.eval_count == 1
        assert any(is_partial(t) for t in ip.display_pub.shown)
    finally:
        ip.display_pub = saved
        ip.user_ns.clear()


def test_cli_run_shows_the_load_progress(gated, gate):
    env = {**gated.client_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_llm.cli", "run", "tiny", "hi", "-n", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []

        def read_stderr() -> None:
            for line in proc.stderr:
                lines.append(line)
                if is_partial(line):
                    gate.touch()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        out = proc.stdout.read()  # until the CLI exits: the gate opened, the answer came
        assert proc.wait(60) == 0 and out.strip()
        reader.join(10)
        assert any(is_partial(line) for line in lines), lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the scheduler's side, with a fake runner factory ------------------------------------------
async def test_the_scheduler_keeps_a_loading_models_progress():
    """What a factory reports during its load is the model's progress until the
    load ends; the loaded model then reports its slots."""
    import asyncio

    from fakes import FakeRunnerFactory
    from scheduler_env import ONE_GPU, entry, make

    from jupyter_llm.api.ps import ps_body
    from jupyter_llm.scheduler import LoadOptions

    reported, proceed = asyncio.Event(), asyncio.Event()

    class Paused(FakeRunnerFactory):
        async def __call__(self, request, report):
            self.report = report
            report(1.7)  # held to 1.0
            reported.set()
            await proceed.wait()
            return await super().__call__(request, report)

    factory = Paused()
    scheduler, _ = make(ONE_GPU, factory, num_parallel=3)
    use = asyncio.ensure_future(scheduler.acquire(entry("m"), LoadOptions(), None))
    async with asyncio.timeout(10):
        await reported.wait()
    assert scheduler.loading_models() == {"m:latest": 1.0}
    assert ps_body(scheduler) == {
        "models": [],
        "loading": [{"name": "m:latest", "model": "m:latest", "progress": 1.0}],
    }
    proceed.set()
    lease = await asyncio.wait_for(use, 10)
    lease.release()
    body = ps_body(scheduler)
    assert body["loading"] == [] and [m["parallel"] for m in body["models"]] == [3]
    factory.report(0.5)  # after its load: goes nowhere
    assert scheduler.loading_models() == {}
