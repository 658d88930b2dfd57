"""A real runner whose model load pauses, after it has reported its first
progress value between 0 and 1, until the file named by
``JUPYTER_LLM_TEST_LOAD_GATE`` exists (at most 120 s): a test can then see the
load's progress from a client without racing the model's load speed.

Started as the runner "interpreter" through a wrapper script:
``slow_load_runner.py -m jupyter_llm.runner --fd N``.
"""

import os
import sys
import time
from pathlib import Path

from jupyter_llm.runner import engine, serve

gate = Path(os.environ["JUPYTER_LLM_TEST_LOAD_GATE"])
_init = engine.Engine.__init__


def init(self, params, progress=None):
    paused = [False]

    def gated(value: float) -> None:
        progress(value)
        if 0 < value < 1 and not paused[0]:
            paused[0] = True
            deadline = time.monotonic() + 120
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    _init(self, params, gated if progress is not None else None)


engine.Engine.__init__ = init
sys.exit(serve.main(sys.argv[sys.argv.index("--fd") :]))
