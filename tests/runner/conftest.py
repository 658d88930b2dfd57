"""The batch loop on the demo model, as the engine tests share it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cores import cores

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.runner.engine import Engine
from jupyter_llm.runner.protocol import LoadParams
from jupyter_llm.runner.step_costs import StepCosts


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """Three sequences in 512 cells, one per test module that asks. Drafted
    tokens cost nothing here (``StepCosts.pinned``): what the tests see of
    drafting never depends on the machine's speed."""
    path = write_demo_model(tmp_path_factory.mktemp("engine") / "m.gguf", DemoModelSpec())
    engine = Engine(LoadParams(path=str(path), n_ctx=512, n_batch=32, n_threads=cores(), n_seq=3))
    engine.step_costs = StepCosts(engine.n_seq, engine.n_batch, pinned=0.0)
    yield engine
    engine.close()
