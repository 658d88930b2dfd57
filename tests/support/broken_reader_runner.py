"""A real runner whose output reader has a planted bug: it raises
RecursionError on the piece of output where ``BOOM`` is complete (while
streaming), or at the end of an output holding ``FINISH`` (when the reader
flushes) — what the tool-call reader did on ``[`` a thousand times before
it was bounded. Everything else is the real runner.

Started as the runner "interpreter" through a wrapper script:
``broken_reader_runner.py -m jupyter_llm.runner --fd N``.
"""

import socket
import sys

from jupyter_llm.chat_formats.output import OutputStream
from jupyter_llm.runner import serve

_feed, _finish = OutputStream.feed, OutputStream.finish


def feed(self, text):
    self.planted_seen = getattr(self, "planted_seen", "") + text
    if "BOOM" in self.planted_seen:
        raise RecursionError("maximum recursion depth exceeded (planted in the reader)")
    return _feed(self, text)


def finish(self, cut_off=False):
    if "FINISH" in getattr(self, "planted_seen", ""):
        raise RecursionError("maximum recursion depth exceeded (planted at the end)")
    return _finish(self, cut_off)


OutputStream.feed, OutputStream.finish = feed, finish
sock = socket.socket(fileno=int(sys.argv[sys.argv.index("--fd") + 1]))
serve.RunnerService(sock).serve()
