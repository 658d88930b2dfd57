"""Which kernel and cell are asking: the source of the origin headers
(``connect.origin``), set when the magics load.

The kernel id is the one Jupyter gave the kernel, read from its connection
file's name (``kernel-<id>.json``); a plain IPython has no kernel and says
``ipython-<pid>``. The cell id is what JupyterLab puts in the execute
request's metadata (``cellId``); the execution count is the cell's ``In [n]``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from jupyter_llm.connect.origin import origin_headers

_KERNEL_FILE = re.compile(r"kernel-(.+)\.json")


def kernel_id_from_file(path: str) -> str:
    """Pure: the kernel id a connection file's name holds (its stem if not Jupyter's)."""
    name = Path(path).name
    found = _KERNEL_FILE.fullmatch(name)
    return found.group(1) if found else Path(name).stem


def kernel_id(shell: Any) -> str:
    """This kernel's id, or ``ipython-<pid>`` outside a Jupyter kernel."""
    if getattr(shell, "kernel", None) is not None:
        try:
            from ipykernel.connect import get_connection_file

            return kernel_id_from_file(get_connection_file())
        except Exception:  # a kernel that no Jupyter app started: no connection file
            pass
    return f"ipython-{os.getpid()}"


def cell_id(shell: Any) -> object:
    """The running cell's id from the execute request (None when unknown)."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent() or {}
    return (parent.get("metadata") or {}).get("cellId")


def running_count(shell: Any) -> int | None:
    """The running cell's ``In [n]``: IPython counts the cell before running
    it, so during the cell its ``execution_count`` is already ``n + 1``."""
    count = getattr(shell, "execution_count", None)
    return count - 1 if isinstance(count, int) and count > 0 else None


def source_for(shell: Any) -> Any:
    """The headers source for ``shell``: asked each time a client is made."""
    ident = kernel_id(shell)

    def headers() -> dict[str, str]:
        return origin_headers(ident, cell_id(shell), running_count(shell))

    return headers
