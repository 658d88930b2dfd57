"""A real runner whose prompt evaluation pauses at its third prompt chunk until
a ``cancel`` has arrived (at most 60 s): a test can then cancel "in the middle
of a long prompt" without racing the model's speed.

Started as the runner "interpreter" through a wrapper script:
``gated_runner.py -m jupyter_llm.runner --fd N``.
"""

import socket
import sys
import threading

import llama_cpp

from jupyter_llm.runner import serve


class Signalled(set):
    """The runner's set of cancelled ids, with an event for the first one."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Event()

    def add(self, item) -> None:
        super().add(item)
        self.arrived.set()


runner = serve.RunnerService(socket.socket(fileno=int(sys.argv[sys.argv.index("--fd") + 1])))
runner.cancelled = Signalled()
chunks = [0]
_decode = llama_cpp.llama_decode


def decode(ctx, batch):
    if batch.n_tokens > 1:  # a prompt chunk (generation decodes one token)
        chunks[0] += 1
        if chunks[0] == 3:
            runner.cancelled.arrived.wait(60)
    return _decode(ctx, batch)


llama_cpp.llama_decode = decode
runner.serve()
