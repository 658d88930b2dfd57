"""Which server a client talks to.

Order: ``JUPYTER_LLM_URL`` (+ ``JUPYTER_LLM_TOKEN``); else the Jupyter server
that started this process (its ``jpserver-<pid>.json``, matched by
``JPY_PARENT_PID`` or the parent pid); else the only running server that has
the extension. Several such servers and none of them the parent is an error
that lists them: starting an embedded engine next to them would put a second
scheduler on the same GPUs. Only when no server with jupyter-llm runs does an
embedded one start (see ``embedded``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx

from jupyter_llm.connect.endpoint import LLMClientError, ServerEndpoint

ServerInfo = dict[str, Any]  # one jpserver-<pid>.json: url, token, pid, root_dir...


class SeveralServersError(LLMClientError):
    """More than one server runs jupyter-llm and nothing says which one to use."""

    def __init__(self, servers: list[ServerInfo]) -> None:
        lines = [
            f"  {s.get('url', '?')}  pid {s.get('pid', '?')}  root {s.get('root_dir', '?')}"
            for s in servers
        ]
        super().__init__(
            "several Jupyter servers run jupyter-llm and none of them started this process:\n"
            + "\n".join(lines)
            + "\nset JUPYTER_LLM_URL to one of these URLs and JUPYTER_LLM_TOKEN to its token "
            "(`jupyter server list` shows both)"
        )
        self.servers = servers


def find_server(embedded: bool = True) -> ServerEndpoint:
    """The endpoint to use; with ``embedded`` and no server running, an embedded one."""
    if url := os.environ.get("JUPYTER_LLM_URL"):
        return ServerEndpoint(url.rstrip("/") + "/", os.environ.get("JUPYTER_LLM_TOKEN", ""), "env")
    servers = [s for s in _running_servers() if _has_extension(s)]
    chosen = choose_server(servers, parent_pids())
    if chosen is not None:
        return ServerEndpoint(chosen["url"], chosen.get("token", ""), "server")
    if not embedded:
        raise LLMClientError("no running Jupyter server with jupyter-llm was found")
    from jupyter_llm.connect.embedded import start_embedded

    return start_embedded()


def choose_server(servers: list[ServerInfo], parents: set[str]) -> ServerInfo | None:
    """Pure: the parent among ``servers``, else the only one, else None when
    there are none; several and no parent raises ``SeveralServersError``."""
    mine = [s for s in servers if str(s.get("pid")) in parents]
    if mine:
        return mine[0]
    if len(servers) == 1:
        return servers[0]
    if servers:
        raise SeveralServersError(servers)
    return None


def parent_pids() -> set[str]:
    """The pids that may be our Jupyter server: the kernel's ``JPY_PARENT_PID``
    and the parent process."""
    pids = {str(os.getppid())}
    if parent := os.environ.get("JPY_PARENT_PID"):
        pids.add(parent)
    return pids


SERVER_FILE = re.compile(r"jpserver-.+\.json")
MAX_SERVER_FILES = 256  # jpserver-*.json files read, in name order
MAX_SERVER_FILE = 64 << 10  # bytes of one (a real one is under 1 KiB)


def running_servers(runtime_dir: Path) -> list[ServerInfo]:
    """The servers whose ``jpserver-<pid>.json`` is in ``runtime_dir`` and
    whose pid is alive, read as ``jupyter server list`` reads them. Not
    through ``jupyter_server.serverapp``: importing it took 2.2-2.6 s of CPU
    on every ``jupyter llm`` call and each kernel's first ``%%llm``. Files of
    dead servers are left for their owner's next start to clean up."""
    try:
        names = sorted(n for n in os.listdir(runtime_dir) if SERVER_FILE.fullmatch(n))
    except OSError:
        return []
    servers = []
    for name in names[:MAX_SERVER_FILES]:
        try:
            with open(runtime_dir / name, "rb") as f:
                data = f.read(MAX_SERVER_FILE + 1)
            if len(data) > MAX_SERVER_FILE:
                continue
            info = json.loads(data)
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(info, dict) and _alive(info.get("pid")) and isinstance(info.get("url"), str):
            servers.append(info)
    return servers


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the pid exists
    except PermissionError:
        return True  # another user's live process
    except (ProcessLookupError, OverflowError):
        return False
    return True


def _running_servers() -> list[ServerInfo]:
    from jupyter_core.paths import jupyter_runtime_dir

    return running_servers(Path(jupyter_runtime_dir()))


def _has_extension(info: ServerInfo) -> bool:
    endpoint = ServerEndpoint(info["url"], info.get("token", ""), "server")
    try:
        with endpoint.http(timeout=3.0) as client:
            return client.get("api/version").status_code == 200
    except httpx.HTTPError:
        return False
