"""The headers that tell the server which kernel and cell a request comes
from (``request.origin``). ``connect`` knows nothing of kernels: the kernel
package sets a source (``set_source``) when its magics load, and every
``ServerEndpoint`` client adds what that source says at the moment it is
made. The CLI sets none, so its requests are ``api``."""

from __future__ import annotations

import logging
from collections.abc import Callable

from jupyter_llm.request.limits import ORIGIN_CHARS
from jupyter_llm.request.origin import CELL_HEADER, COUNT_HEADER, KERNEL_HEADER, MAX_COUNT, PLAIN

log = logging.getLogger(__name__)
Source = Callable[[], dict[str, str]]
_source: list[Source] = []


def set_source(source: Source | None) -> None:
    """Where the origin headers come from (None: nowhere)."""
    _source[:] = [source] if source is not None else []


def current_headers() -> dict[str, str]:
    """The source's headers now; a source that fails sends none (a request
    is never refused for its accounting)."""
    if not _source:
        return {}
    try:
        return _source[0]()
    except Exception:
        log.debug("origin headers unavailable", exc_info=True)
        return {}


def plain(value: object) -> str | None:
    """``value`` if the server would take it (short, plain), else None."""
    if not isinstance(value, str) or not value or len(value) > ORIGIN_CHARS.value:
        return None
    return value if PLAIN.fullmatch(value) else None


def origin_headers(kernel: str | None, cell: object, count: object) -> dict[str, str]:
    """Pure: the headers for a kernel id, a cell id and an execution count,
    each left out when the server would refuse it."""
    if plain(kernel) is None:
        return {}
    headers = {KERNEL_HEADER: str(kernel)}
    if (cell_id := plain(cell)) is not None:
        headers[CELL_HEADER] = cell_id
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count < MAX_COUNT:
        headers[COUNT_HEADER] = str(count)
    return headers
