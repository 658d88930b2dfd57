"""Cutting a batch-only decode step short when interactive work arrives.

An interactive request that arrives while every slot decodes batch work would
otherwise wait for the step in flight: on 2 cores, a step of four batch
sequences with their drafts costs about twice an idle model's whole first
token. llama.cpp's CPU backend asks an abort callback after every graph
node; when it says yes, ``llama_decode`` returns 2 and removes the step's
positions from the KV cache (one ubatch per step here: ``n_batch`` equals
``n_ubatch``), so the step is as if it never ran. The engine keeps every
sequence's state as it was before the step and runs it again later: greedy
output is unchanged.

The callback runs on llama.cpp's compute thread hundreds of times a step, so
it must not be Python (each call would take the GIL). It is the C library's
own ``strlen`` over a two-byte buffer: byte 0 is the flag, byte 1 the
terminator, so it returns 1 (abort) when the flag is set and 0 otherwise.
Where no C library is found, steps are simply never cut.

Bounds: only steps that hold batch work alone are armed, and a step is never
cut twice in a row, so each interactive arrival costs batch work at most part
of one step and batch work always advances (``may_cut``).

Never armed where the model keeps a recurrent state (Mamba, RWKV, hybrids):
llama.cpp advances that state as the step begins and cannot take it back
(its rollback refuses a partial removal), so the step run again would start
past its own positions and fail every sequence in it. Never armed either
for an image's decode (``disarm``): mtmd's helper turns a cut into a failed
request.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

import llama_cpp

from jupyter_llm.runner.llama_backend import hold_log, release_log

ABORTED = 2  # llama_decode's status for a step the callback cut short


def may_cut(batch_only: bool, cut_last: bool) -> bool:
    """May this step be cut short by interactive work? Only a step of batch
    work alone, and not right after a cut step (batch work always advances)."""
    return batch_only and not cut_last


def _strlen() -> Any:
    """The C library's ``strlen`` as llama.cpp's abort callback type, or None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    return llama_cpp.ggml_abort_callback(address) if address else None


class StepInterrupt:
    """The flag interactive arrivals set and the armed step's callback reads."""

    def __init__(self, ctx: Any, rolls_back: bool = True) -> None:
        """``rolls_back``: can the context's memory take a step back (no
        recurrent state)? Steps are never cut where it cannot."""
        self._ctx = ctx
        self._flag = (ctypes.c_ubyte * 2)()  # [flag, terminator]
        self._check = _strlen() if rolls_back else None
        self._armed = False
        self.cut_last = False  # the previous step was cut short
        self.cuts = 0  # steps cut so far (tests and the log read it)

    @property
    def available(self) -> bool:
        return self._check is not None

    def request(self) -> None:
        """Interactive work arrived (the runner's reader thread): cut the
        armed step in flight, or the next one armed before the main loop
        reads the queue again."""
        self._flag[0] = 1

    def clear(self) -> None:
        """The main loop is about to read its queue: arrivals until now are
        in it, so the flag starts again from here."""
        self._flag[0] = 0

    def decode(self, batch: Any, batch_only: bool) -> int:
        """``llama_decode`` of ``batch``, armed where ``may_cut`` says so.
        Returns its status; ``ABORTED`` means the step left nothing behind
        and must run again."""
        arm = self.available and may_cut(batch_only, self.cut_last)
        self._arm(arm)
        if arm:
            hold_log()
        rc = int(llama_cpp.llama_decode(self._ctx, batch))
        self.cut_last = arm and rc == ABORTED
        if arm:
            release_log(drop=self.cut_last)  # a cut's rollback is logged as errors
        self.cuts += self.cut_last
        return rc

    def disarm(self) -> None:
        """No callback for the decodes that follow until the next ``decode``
        (an image's, which mtmd runs on the same context)."""
        self._arm(False)

    def _arm(self, arm: bool) -> None:
        if arm == self._armed:
            return
        if arm:
            flag = ctypes.cast(self._flag, ctypes.c_void_p)
            llama_cpp.llama_set_abort_callback(self._ctx, self._check, flag)
        else:
            llama_cpp.llama_set_abort_callback(self._ctx, llama_cpp.ggml_abort_callback(), None)
        self._armed = arm
