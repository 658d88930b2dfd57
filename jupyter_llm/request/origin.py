"""Where a request comes from beside its user: the kernel and the cell.

The kernel client (``%%llm``, ``map()``, the official clients made by
``jupyter_llm.client()``) sends ``X-LLM-Kernel`` (its kernel id),
``X-LLM-Cell`` (the cell's id, from the execute request's metadata) and
``X-LLM-Execution-Count``; any other client sends none and is ``api``. The
values are untrusted: they are kept in the usage table and shown back in
notebooks, so each is short and made of a few plain characters
(``ORIGIN_CHARS``), and a bad one is a 400.

The handler base reads them once per request (``read_origin``) into
``ORIGIN``, a context variable that ``api.generation`` reads, as ``ROUTE`` is
read for the metrics: no request dataclass grows a field for it.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable
from dataclasses import dataclass

from jupyter_llm.request.limits import ORIGIN_CHARS

KERNEL_HEADER = "X-LLM-Kernel"
CELL_HEADER = "X-LLM-Cell"
COUNT_HEADER = "X-LLM-Execution-Count"
HEADERS = (KERNEL_HEADER, CELL_HEADER, COUNT_HEADER)
API = "api"  # the kernel of every request that names none
MAX_COUNT = 10**9  # an execution count; a kernel never runs this many cells
PLAIN = re.compile(r"[A-Za-z0-9_.:@-]*")


@dataclass(frozen=True)
class Origin:
    """The kernel and cell a request came from (``API`` and ``""``: not a kernel)."""

    kernel: str = API
    cell: str = ""  # the cell's id; "" when the client knows none
    execution_count: int | None = None


NO_ORIGIN = Origin()
ORIGIN: contextvars.ContextVar[Origin] = contextvars.ContextVar(
    "jupyter_llm_origin", default=NO_ORIGIN
)


def plain_name(value: str, where: str) -> str:
    """``value`` if it is short and plain (``ORIGIN_CHARS``), else a ``ValueError``
    naming ``where`` (never echoing the value: it may be anything)."""
    ORIGIN_CHARS.check(where, len(value))
    if not PLAIN.fullmatch(value):
        raise ValueError(
            f"{where} may hold only letters, digits and - _ . : @ ({ORIGIN_CHARS.key})"
        )
    return value


def parse_origin(header: Callable[[str], str | None]) -> Origin:
    """The origin the headers name (``header``: a header's value or None);
    a ``ValueError`` for a value that is too long or not plain."""
    kernel = (header(KERNEL_HEADER) or "").strip()
    cell = (header(CELL_HEADER) or "").strip()
    count_text = (header(COUNT_HEADER) or "").strip()
    count = None
    if count_text:
        if not count_text.isascii() or not count_text.isdigit() or len(count_text) > 9:
            raise ValueError(f"{COUNT_HEADER} must be a whole number under {MAX_COUNT:,}")
        count = int(count_text)
    if not kernel:  # a cell without its kernel says nothing worth keeping
        plain_name(cell, CELL_HEADER)
        return NO_ORIGIN
    return Origin(plain_name(kernel, KERNEL_HEADER), plain_name(cell, CELL_HEADER), count)


def cell_key(origin: Origin) -> str:
    """The cell a usage row is kept under: its id, else ``In [n]``, else ``""``."""
    if origin.cell:
        return origin.cell
    return f"In [{origin.execution_count}]" if origin.execution_count is not None else ""
