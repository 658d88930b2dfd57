"""llama.cpp's backend, started once per runner: its log goes to stderr,
which the server reads (buffer sizes, errors), and feeds ``allocation_log``,
what the current load allocated per device."""

from __future__ import annotations

import ctypes
import sys

import llama_cpp

from jupyter_llm.memory.measured import AllocationLog

_LOG_DEBUG, _LOG_CONT = 1, 5  # enum ggml_log_level
_log_state: dict = {"keep": True, "ready": False, "held": None}
allocation_log = AllocationLog()  # what the current load allocated, per device


@llama_cpp.llama_log_callback
def _log_to_stderr(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's INFO and up go to stderr and the allocation log; DEBUG
    lines (and their continuations) are dropped."""
    keep = _log_state["keep"] if level == _LOG_CONT else level != _LOG_DEBUG
    _log_state["keep"] = keep
    if keep:
        line = text.decode(errors="replace")
        if _log_state["held"] is not None:
            _log_state["held"].append(line)
            return
        _write(line)


def _write(line: str) -> None:
    allocation_log.feed(line)
    sys.stderr.write(line)
    sys.stderr.flush()


def hold_log() -> None:
    """Keep llama.cpp's lines back until ``release_log``: a decode step that
    interactive work cuts short (``runner.interrupt``) logs its rollback as
    errors, which are no news to anyone reading the server's log."""
    _log_state["held"] = []


def release_log(drop: bool) -> None:
    """Write the lines held since ``hold_log``, or drop them."""
    held, _log_state["held"] = _log_state["held"] or [], None
    for line in [] if drop else held:
        _write(line)


def init_backend() -> None:
    """Route llama.cpp's log and initialise its backends (the first call only)."""
    if not _log_state["ready"]:
        llama_cpp.llama_log_set(_log_to_stderr, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _log_state["ready"] = True
