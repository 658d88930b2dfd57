"""A real Jupyter server with jupyter-llm in its own process, for tests that
need one outside the test's event loop (CLI, fuzzing, notebooks)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import httpx
import psutil

QUICK_START = Path(__file__).parent / "quick_start"


PORT_TRIES = 3


class LiveServer:
    def __init__(
        self,
        models: Path,
        root: Path,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        ready: str = "llm/api/version",
        log: Path | None = None,
        wrapper: list[str] | None = None,
        quick_start: bool = True,
    ) -> None:
        """Start the server (through ``wrapper``, a command that execs its
        arguments, if given) and wait until ``ready`` (a path under the base URL)
        answers 200; ``log`` receives the server's output. ``quick_start``
        leaves out an import no test needs (support/quick_start); a test of
        what a user's whole server costs turns it off."""
        self.token = secrets.token_hex(8)
        self.env = {
            **os.environ,
            "JUPYTER_LLM_MODELS": str(models),
            "JUPYTER_LLM_NUM_THREADS": "1",
            **(env or {}),
        }
        if quick_start:
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(QUICK_START), self.env.get("PYTHONPATH")) if p
            )
        # without a log of the test's own, one in /tmp: kept when the server
        # fails to start or outlives SIGTERM (named in the warning), else removed
        self._own_log: Path | None = None
        if log is None:
            fd, name = tempfile.mkstemp(prefix="live-server-", suffix=".log")
            os.close(fd)
            log = self._own_log = Path(name)
        self.log_path = log
        self._log = log.open("ab")
        # a port found free may be taken by another worker before the server
        # binds it: the server then exits (no retries on other ports, where a
        # test could not find it) and starts again on another
        for _ in range(PORT_TRIES):
            if self._start(root, args, wrapper, ready):
                return
            if self.proc.poll() is None or b"already in use" not in self.log_path.read_bytes():
                break  # not a lost port: stop() ends it
            self.client.close()
        self._own_log = None  # kept for the error
        self.stop()
        tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(
            f"the Jupyter server did not start (its log: {self.log_path}); it ends:\n"
            + "\n".join(tail)
        )

    def _start(
        self, root: Path, args: list[str] | None, wrapper: list[str] | None, ready: str
    ) -> bool:
        """Starts the server on a free port; whether it answered ``ready``
        (else it exited, or did not answer within a minute)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            [
                *(wrapper or []),
                sys.executable,
                "-m",
                "jupyter_server",
                "--no-browser",
                "--allow-root",
                f"--port={self.port}",
                "--ServerApp.port_retries=0",
                "--ip=127.0.0.1",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={root}",
                *(args or []),
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        self.client = httpx.Client(
            base_url=f"{self.url}llm/", timeout=60, headers={"Authorization": f"token {self.token}"}
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.client.get(f"{self.url}{ready}").status_code == 200:
                    return self.proc.poll() is None  # ours, not one on a port it lost
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        return False

    @property
    def client_env(self) -> dict[str, str]:
        """Environment for a client process that should use this server."""
        return {**os.environ, "JUPYTER_LLM_URL": self.url, "JUPYTER_LLM_TOKEN": self.token}

    def runners(self) -> list[psutil.Process]:
        """The server's runner processes still alive (its descendants whose
        command line runs ``jupyter_llm.runner``). Fuzzing asks after every
        request: one pass over /proc/*/stat here costs half of psutil's
        ``children(recursive=True)``, which also builds a Process per pid."""
        runners = []
        for pid in _descendants(self.proc.pid):
            try:
                process = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
            if _is_live_runner(process):
                runners.append(process)
        return runners

    def stop(self) -> None:
        self.client.close()
        hung = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                hung = True
                self._dump_stacks()
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if hung:
            warnings.warn(
                f"the Jupyter server at {self.url} outlived SIGTERM by 30 s and was killed; "
                f"its log: {self.log_path}",
                stacklevel=2,
            )
        elif self._own_log is not None:
            self._own_log.unlink(missing_ok=True)

    def _dump_stacks(self) -> None:
        """Where a server that outlived SIGTERM waits: every thread's stack,
        by py-spy where the environment has it (Ray brings it), into its log.
        The server is still alive here (it is killed after)."""
        spy = Path(sys.executable).with_name("py-spy")
        if not spy.exists():
            return
        self._log.write(b"\n--- py-spy dump of the server that outlived SIGTERM ---\n")
        self._log.flush()
        try:
            subprocess.run(
                [str(spy), "dump", "--pid", str(self.proc.pid)],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            pass


def _descendants(root: int) -> list[int]:
    """Every pid below ``root`` in the process tree, from one read of /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited since the listing
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])  # the name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def _is_live_runner(process: psutil.Process) -> bool:
    """A runner that has not exited (an exited one not yet reaped is a zombie)."""
    try:
        return "jupyter_llm.runner" in " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False
