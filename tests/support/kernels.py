"""The one way tests start a real IPython kernel.

jupyter_client picks a kernel's five TCP ports by binding port 0 and closing
the socket; the kernel binds them a moment later. With pytest's workers,
servers and runners starting beside it, another process can take a port in
between, and the kernel dies with "Address already in use" (it failed CI
once). Kernels here listen on Unix sockets (``transport="ipc"``) in a
folder of their own instead, where no other process picks names.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def kernel_manager(connection_file: Path | None = None) -> Any:
    """A ``KernelManager`` for ``python3`` on IPC sockets; the caller starts
    it, and :func:`forget` removes its socket folder after shutdown."""
    from jupyter_client.manager import KernelManager

    # a Unix socket's path holds at most 107 bytes: a short folder, not tmp_path
    folder = tempfile.mkdtemp(prefix="jlk-", dir="/tmp")
    extra = {"connection_file": str(connection_file)} if connection_file else {}
    return KernelManager(
        kernel_name="python3", transport="ipc", ip=str(Path(folder) / "k"), **extra
    )


def forget(km: Any) -> None:
    """Removes the socket folder a :func:`kernel_manager` made."""
    shutil.rmtree(Path(km.ip).parent, ignore_errors=True)


@contextmanager
def running_kernel(
    env: dict[str, str],
    connection_file: Path | None = None,
    startup_timeout: float = 60,
    **start: Any,
) -> Iterator[tuple[Any, Any]]:
    """A started kernel and its ready, blocking client, shut down after."""
    km = kernel_manager(connection_file)
    try:
        km.start_kernel(env=env, **start)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=startup_timeout)
            yield km, kc
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    finally:
        forget(km)
