"""llama.cpp's backend, started once per runner: its log goes to stderr,
which the server reads (buffer sizes, errors), and feeds ``allocation_log``,
what the current load allocated per device."""

from __future__ import annotations

import ctypes
import sys

import llama_cpp

from jupyter_llm.memory.measured import AllocationLog

_LOG_DEBUG, _LOG_CONT = 1, 5  # enum ggml_log_level
_log_state = {"keep": True, "ready": False}
allocation_log = AllocationLog()  # what the current load allocated, per device


@llama_cpp.llama_log_callback
def _log_to_stderr(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's INFO and up go to stderr and the allocation log; DEBUG
    lines (and their continuations) are dropped."""
    keep = _log_state["keep"] if level == _LOG_CONT else level != _LOG_DEBUG
    _log_state["keep"] = keep
    if keep:
        line = text.decode(errors="replace")
        allocation_log.feed(line)
        sys.stderr.write(line)
        sys.stderr.flush()


def init_backend() -> None:
    """Route llama.cpp's log and initialise its backends (the first call only)."""
    if not _log_state["ready"]:
        llama_cpp.llama_log_set(_log_to_stderr, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _log_state["ready"] = True
