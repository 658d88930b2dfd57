"""The Jupyter server's process ends when it is stopped, even where AnyIO
left a worker thread waiting.

jupyter_server reads and writes files through ``anyio.to_thread``. AnyIO's
worker threads are not daemons, and each stops only when the task that
first used it ends. A request still in flight when the server stops never
ends, so its idle worker waits on its queue for good, and the interpreter,
which joins every non-daemon thread at exit, hangs there: Ctrl-C and
SIGTERM alike stop the server and leave the process (jupyterlab#10442;
about one JupyterLab server in 60 of our browser tests). ``install``
registers, once, a hook that runs at exit before those threads are joined
(``threading._register_atexit``, as ``concurrent.futures`` stops its own
pools) and asks every AnyIO worker to stop, as AnyIO does when its task
ends: an idle one ends at once, a busy one after its call.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading

log = logging.getLogger(__name__)
_installed = False


def install() -> None:
    """Register ``stop_anyio_workers`` to run at exit (once per process)."""
    global _installed
    register = getattr(threading, "_register_atexit", None)
    if _installed or register is None:
        return
    try:
        register(stop_anyio_workers)
    except RuntimeError:  # already shutting down: nothing is joined after this
        return
    _installed = True


def stop_anyio_workers() -> int:
    """Ask each live AnyIO worker thread to stop; how many were asked."""
    try:
        from anyio._backends._asyncio import WorkerThread
    except ImportError:  # an AnyIO without the asyncio backend's workers
        return 0
    asked = 0
    for thread in threading.enumerate():
        work = getattr(thread, "queue", None)
        if not isinstance(thread, WorkerThread) or not thread.is_alive() or work is None:
            continue
        with contextlib.suppress(queue.Full, AttributeError):
            work.put_nowait(None)  # AnyIO's own stop message
            asked += 1
    if asked:
        log.debug("asked %d AnyIO worker thread(s) to stop at exit", asked)
    return asked
