"""``%llm plan``: the server's plan drawn with ``%llm devices``' bars, against a
live server whose simulated GPU holds one demo model but not two."""

from __future__ import annotations

import json

import pytest
from IPython.core.interactiveshell import InteractiveShell
from live_server import LiveServer

from jupyter_llm.connect import ServerEndpoint
from jupyter_llm.kernel.magics import LLMMagics, MagicUsageError, parse_plan_args
from jupyter_llm.kernel.plan_view import PlanView, plan_html
from jupyter_llm.memory import MIN_GPU_BYTES, EstimateOptions, estimate
from jupyter_llm.memory.model_info import read_model_info
from jupyter_llm.models.store import ModelStore

MiB = 1 << 20


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_gguf):
    models = tmp_path_factory.mktemp("plan-models")
    store = ModelStore(models)
    digest = store.add_blob_from_file(demo_gguf)
    for name in ("tiny", "tiny2"):
        store.create(name, {"t.gguf": digest})
    est = estimate(read_model_info(demo_gguf), EstimateOptions(num_ctx=2048))
    one = MIN_GPU_BYTES + est.graph_full + sum(est.layer_size(i) for i in range(3))
    gpu = {"id": "GPU-0", "library": "CUDA", "name": "RTX Sim",
           "total_memory": 2 * one, "free_memory": one + MiB}  # fmt: skip
    env = {
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps([gpu]),
        "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("plan-runtime")),
    }
    server = LiveServer(models, models, env)
    yield server
    server.stop()


@pytest.fixture
def shell(live):
    ip = InteractiveShell.instance()
    ip.register_magics(LLMMagics(shell=ip, endpoint=ServerEndpoint(live.url, live.token, "env")))
    yield ip
    ip.user_ns.clear()


def test_plan_draws_the_devices_bars_and_names_the_eviction(shell, live):
    endpoint = ServerEndpoint(live.url, live.token, "env")
    view = shell.run_line_magic("llm", "plan tiny --num-ctx 1024")
    assert isinstance(view, PlanView)
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"].startswith("tiny:latest fits: 3/3 layers on GPUs")
    assert "context 1024" in bundle["text/plain"]
    assert "RTX Sim · CUDA" in bundle["text/html"] and "System RAM" in bundle["text/html"]
    assert 'title="tiny:latest (plan) weights' in bundle["text/html"]
    assert endpoint.request("GET", "api/ps")["models"] == []  # nothing loaded

    shell.run_cell_magic("llm", "tiny -n 1", "hi")
    bundle = shell.run_line_magic("llm", "plan tiny2 --num-gpu 3")._repr_mimebundle_()
    assert "evicts tiny:latest" in bundle["text/plain"]
    assert "evicts tiny:latest" in bundle["text/html"]
    # the evicted model is not drawn: the GPU's bar is the planned model and free
    assert "tiny:latest weights" not in bundle["text/html"]
    assert [m["name"] for m in endpoint.request("GET", "api/ps")["models"]] == ["tiny:latest"]


def test_usage_and_server_errors_are_one_red_line(shell, capsys):
    assert shell.run_line_magic("llm", "plan") is None
    assert "the following arguments are required: model" in capsys.readouterr().out
    assert shell.run_line_magic("llm", "plan tiny --num-ctx many") is None
    assert "invalid int value: 'many'" in capsys.readouterr().out
    assert shell.run_line_magic("llm", "plan nothere") is None
    assert "model 'nothere:latest' not found" in capsys.readouterr().out


def test_parse_plan_args():
    assert parse_plan_args(["m", "--num-ctx", "512", "--num-gpu", "0"], "p") == {
        "model": "m",
        "options": {"num_ctx": 512, "num_gpu": 0},
    }
    assert parse_plan_args(["m"], "p") == {"model": "m", "options": {}}
    with pytest.raises(MagicUsageError):
        parse_plan_args(["m", "--bogus"], "p")


def test_plan_html_is_escaped_and_shows_what_stays_loaded():
    gib = 1 << 30
    entry = {"device": "GPU-0", "name": "<b>gpu</b>", "library": "CUDA", "layers": 3,
             "weights": gib, "kv_cache": gib // 4, "graph": gib // 8,
             "total_memory": 8 * gib, "free_memory": 4 * gib}  # fmt: skip
    plan = {"model": "<script>m</script>", "fits": True, "reason": "", "loaded": False,
            "evicts": [], "busy": [], "context_length": 4096, "parallel": 4,
            "num_gpu_layers": 3, "num_layers": 3, "layout": [entry]}  # fmt: skip
    other = {"name": "kept", "allocations": [{"device": "GPU-0", "weights": 2 * gib}]}
    page = plan_html(plan, [other])
    assert "<script>" not in page and "<b>gpu</b>" not in page
    assert "&lt;b&gt;gpu&lt;/b&gt; · CUDA" in page and "3 layers" in page
    assert 'title="kept weights: 2.00 GiB"' in page
    # free after the load: 4 GiB free less the plan's 1.375 GiB
    assert 'title="free: 2.62 GiB"' in page
