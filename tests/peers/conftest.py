"""Peers' own suites against a real server: one Jupyter server with the
extension, started once for the package, and the generated models it
serves. Nothing here is fetched from a hub.

Models:

- ``tiny``: the demo model (random weights, a byte-level vocabulary, a
  ChatML template without tools); chat and embeddings.
- ``qwen``: the same weights under Qwen 2.5's real chat template (Hermes
  ``<tool_call>`` format, ``<tool_call>`` one added token as in Qwen's
  vocabulary), so the server offers tools, ``tool_choice`` and forced calls.
- ``eager-qwen``: ``qwen`` whose favourite token is ``<tool_call>``: greedy
  decoding opens a call of its own accord wherever it may (with tools and no
  ``tool_choice``, as an Ollama client sends them); without tools it writes
  that token as text.

A random-weight model never chooses to call a tool and its text is noise:
tests whose assertion is about what the model says are marked as model
failures (xfail, for the exception that content raises), never the ones
about the wire. ``gemma-tools`` (``gemma_tools``), the real Gemma 3 270M
with a tool template, is added for the tests where real text matters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cores import cores
from live_server import LiveServer

from jupyter_llm.chat_formats import read_template
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

QWEN = read_template("Qwen-Qwen2.5-7B-Instruct")
MODELS: dict[str, DemoModelSpec] = {
    "tiny": DemoModelSpec(),
    "qwen": DemoModelSpec(chat_template=QWEN, extra_tokens=("<tool_call>", "</tool_call>")),
    "eager-qwen": DemoModelSpec(
        chat_template=QWEN, extra_tokens=("<tool_call>", "</tool_call>"), favourite="<tool_call>"
    ),
}

LOADED = re.compile(r"runner (\d+) loaded the model")


@dataclass(frozen=True)
class Peer:
    """Where a peer client finds the server."""

    url: str  # the Jupyter server, ending in "/"
    token: str
    server: LiveServer
    models: Path  # the server's store: a model created there is served at once
    log: Path  # the server's output
    dead: set[int] = field(default_factory=set)  # runners seen dead so far

    @property
    def ollama(self) -> str:
        """An Ollama client's host."""
        return f"{self.url}llm"

    @property
    def openai(self) -> str:
        """An OpenAI client's base_url."""
        return f"{self.url}llm/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def loaded_runners(self) -> set[int]:
        """Every runner the server has loaded a model in, by its log."""
        text = self.log.read_text(errors="replace")
        return {int(pid) for pid in LOADED.findall(text)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A standard-suite class with ``ONLY`` (test names) runs just those."""
    keep, drop = [], []
    for item in items:
        only = getattr(getattr(item, "cls", None), "ONLY", None)
        name = getattr(item, "originalname", item.name)
        (drop if only is not None and name not in only else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="package")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    root = tmp_path_factory.mktemp("peers")
    store = ModelStore(root / "models")
    for name, spec in MODELS.items():
        path = write_demo_model(root / f"{name}.gguf", spec)
        store.create(name, {f"{name}.gguf": store.add_blob_from_file(path)})
    server = LiveServer(
        root / "models",
        root,
        env={
            "JUPYTER_LLM_NUM_PARALLEL": "2",
            "JUPYTER_LLM_KEEP_ALIVE": "-1",
            "JUPYTER_LLM_MAX_LOADED_MODELS": "8",
        },
        log=root / "server.log",
    )
    try:
        yield Peer(server.url, server.token, server, root / "models", root / "server.log")
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _no_runner_dies(request: pytest.FixtureRequest) -> Iterator[None]:
    """No peer's request may kill a runner. Models stay loaded (keep_alive -1,
    more models kept than there are), so every runner the server's log says
    it loaded lives to the end: one gone died, in the test that just ran."""
    yield
    if "peer" not in request.fixturenames:
        return
    peer: Peer = request.getfixturevalue("peer")
    dead = peer.loaded_runners() - {p.pid for p in peer.server.runners()} - peer.dead
    peer.dead.update(dead)
    assert not dead, f"runner processes {sorted(dead)} died during the test"


@pytest.fixture(scope="package")
def gemma_tools(peer: Peer, gemma_tools_gguf: Path) -> str:
    """The real Gemma 3 270M with a Hermes tool template added (tests/conftest.py),
    served as ``gemma-tools``: a model that writes language, closes its
    strings, and chooses (or not) to call."""
    store = ModelStore(peer.models)
    store.create(
        "gemma-tools",
        {"gemma.gguf": store.add_blob_from_file(gemma_tools_gguf)},
        # the server decodes on one thread (LiveServer); Gemma is faster on
        # every core the test has, the client only waits on it
        parameters={"num_thread": cores()},
    )
    return "gemma-tools"
