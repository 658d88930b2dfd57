"""The last token's hidden state, read from llama.cpp's graph as it runs,
so a last-token embedding costs what a prompt costs.

A llama.cpp context made for embeddings outputs every token of a batch,
and a generative model's graph then runs its output layer over all of them:
on Gemma 3 270M (a 262k vocabulary) that is 1 MiB of logits per token, a
512-token piece held 1 GiB more in the runner (counted by no estimate), and
an input took 2.2x as long. Last-token pooling needs one row. So such a
model embeds in a context made for generation, with only each input's last
token marked as output, and this reads the rows of the final norm
(``result_norm``, what llama.cpp's own last-token pooling takes) through
the scheduler's eval callback: the output layer then runs on those rows
only.

Runs in the runner process only; the callback is called on the thread that
calls ``llama_decode``.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
from llama_cpp._ggml import libggml

NORM = b"result_norm"  # llama.cpp's name for the final norm's output (``res->t_embd``)
GGML_TYPE_F32 = 0  # ``enum ggml_type``: the first member of ``struct ggml_tensor``

_get_name = libggml.ggml_get_name
_get_name.argtypes, _get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
_nbytes = libggml.ggml_nbytes
_nbytes.argtypes, _nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
_tensor_get = libggml.ggml_backend_tensor_get
_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
_tensor_get.restype = None


class LastRows:
    """Collects the final norm's rows (one per output token, in batch order)
    of each ``llama_decode`` of a context made with ``callback`` as its
    ``cb_eval``. ``clear`` before a decode; ``rows`` after it."""

    def __init__(self, n_embd: int) -> None:
        self.n_embd = n_embd
        self.rows: list[list[float]] = []
        self.failed = ""  # why a computed norm could not be read (not f32, not whole rows)
        # kept here: llama.cpp holds only the pointer
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._seen)

    def clear(self) -> None:
        self.rows.clear()
        self.failed = ""

    def _seen(self, tensor: Any, ask: bool, user_data: Any) -> bool:
        """Asked about every node: wants the norm's data. Told once it is
        computed: copies its rows out, and lets the graph go on."""
        if ask:
            return _get_name(tensor) == NORM
        size = _nbytes(tensor)
        width = self.n_embd * 4
        if ctypes.c_int.from_address(tensor).value != GGML_TYPE_F32 or size % width:
            self.failed = f"the final norm is not {self.n_embd} f32 values a row"
            return True
        if size:
            data = (ctypes.c_float * (size // 4))()
            _tensor_get(tensor, data, 0, size)
            self.rows += [data[i : i + self.n_embd] for i in range(0, size // 4, self.n_embd)]
        return True
