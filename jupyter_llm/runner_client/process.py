"""``RunnerProcess``: the one place that spawns a runner, for discovery and serving.

The runner talks over a private socketpair (no TCP port). Its stderr is read
continuously: the tail is kept for diagnostics and the last error-looking line
is used in the error a client sees when the runner fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

from jupyter_llm.request.errors import AllocationFailed, InvalidRequest, RunnerFailed
from jupyter_llm.request.json_size import small
from jupyter_llm.request.limits import DECODE_ON_LOOP_BYTES
from jupyter_llm.runner.protocol import (
    ALLOCATION,
    INVALID,
    Error,
    ProtocolError,
    decode,
    encode,
    is_crash_line,
    is_error_line,
    read,
)

log = logging.getLogger(__name__)

STREAM_LIMIT = 64 * 1024 * 1024  # the longest reply line; embeddings come in parts below it
# replies one request may have waiting for its reader, and their bytes (a
# token message with 256 tokens' top 20 logprobs is 500 KB): a reader that
# stopped (a client that reads nothing, its flush waiting) would otherwise
# hold the whole answer in the server, and get it as one batch to encode
MAX_BACKLOG = 16384
MAX_BACKLOG_BYTES = 16 << 20
_EOF = object()


class RunnerProcess:
    """A runner child process and the client side of its protocol."""

    def __init__(
        self,
        *,
        python: str = "",
        env: dict[str, str] | None = None,
        label: str = "runner",
    ) -> None:
        self.python = python or sys.executable
        self.env = env or {}
        self.label = label
        self.limit = STREAM_LIMIT  # bytes of one reply line
        # the last stderr line that looks like a failure's reason: any until the
        # model is loaded, then crashes only (``_read_stderr``)
        self.last_error: str = ""
        self.loaded = False
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Queue[Any]] = {}
        self._backlog: dict[int, int] = {}  # bytes of each request's replies not yet taken
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._dead: RunnerFailed | None = None
        self._exited = asyncio.Event()
        self._closing = False
        self._kill_reason = ""
        self._stop_reason: RunnerFailed | None = None  # why ``close`` was asked, if said

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "jupyter_llm.runner",
                "--fd",
                str(child.fileno()),
                pass_fds=(child.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as e:
            parent.close()
            raise RunnerFailed(
                f"could not start the runner process with the interpreter {self.python} "
                f"(the python setting): {e.strerror or e}"
            ) from e
        finally:
            child.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=parent, limit=self.limit)
        self._tasks = [
            asyncio.create_task(self._read_replies(reader)),
            asyncio.create_task(self._read_stderr()),
        ]
        log.debug("%s started (pid %s)", self.label, self.pid)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._dead is None and self._proc.returncode is None

    async def close(self, timeout: float = 5.0, reason: RunnerFailed | None = None) -> None:
        """Ask the runner to exit; kill it if it does not within ``timeout``.
        Requests still in flight end with ``reason`` if given (an admin's
        unload), else with how the process ended."""
        if self._proc is None:
            return
        self._closing = True
        if self._dead is None:
            self._stop_reason = self._stop_reason or reason
        if self.alive:
            with contextlib.suppress(Exception):
                self._send({"id": 0, "op": "close"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), timeout)
        self.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._proc.wait(), timeout)
        await asyncio.wait_for(self._exited.wait(), timeout)
        for task in self._tasks:
            task.cancel()

    async def exited(self) -> None:
        """Returns once the runner has exited (after ``start``)."""
        await self._exited.wait()

    def kill(self, reason: str = "") -> None:
        """Synchronous SIGKILL, safe to call from shutdown paths. ``reason``
        ("made no progress for 300s") becomes the error of what was in flight."""
        if self._proc is not None and self._proc.returncode is None:
            self._kill_reason = self._kill_reason or reason
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    # -- requests ------------------------------------------------------------------
    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and wait for its single reply."""
        async for message in self.stream(op, **args):
            return message
        raise RunnerFailed(f"{self.label} sent no reply to {op}")

    async def stream(self, op: str, **args: Any) -> AsyncIterator[dict[str, Any]]:
        """Send a request and yield its replies until ``done``/``result``.

        Closing the iterator early (client gone, task cancelled) cancels the
        request in the runner.
        """
        batches = self.stream_batches(op, **args)
        try:
            async for batch in batches:
                for message in batch:
                    yield message
        finally:
            await batches.aclose()

    async def stream_batches(self, op: str, **args: Any) -> AsyncIterator[list[dict[str, Any]]]:
        """Like ``stream`` but yields every reply that has already arrived as one
        list, so a consumer slower than the model writes fewer, larger chunks."""
        rid = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending[rid] = queue
        finished = False
        try:
            self._raise_if_dead()
            message = {**args, "id": rid, "op": op}
            if small(message, DECODE_ON_LOOP_BYTES):
                self._send(message)
            else:  # a 32 MiB prompt takes a quarter of a second to encode
                data = await asyncio.get_running_loop().run_in_executor(None, encode, message)
                self._send_encoded(data)
            while not finished:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                self._backlog[rid] = 0
                out = []
                for message in batch:
                    if message is _EOF:
                        self._raise_if_dead()
                        raise RunnerFailed(f"{self.label} stopped answering")
                    if message.get("type") == "error":
                        finished = True
                        raise self._failure(message, explained=op == "load")
                    out.append(message)
                    if message.get("type") in ("done", "result"):
                        finished = True
                        if op == "load":  # from here on, requests' lines are not quoted
                            self.loaded, self.last_error = True, ""
                        break
                yield out
        finally:
            self._pending.pop(rid, None)
            self._backlog.pop(rid, None)
            if not finished and self.alive:
                with contextlib.suppress(Exception):
                    self._send({"id": 0, "op": "cancel", "target": rid})

    # -- internals -----------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        self._send_encoded(encode(message))

    def _send_encoded(self, data: bytes) -> None:
        if self._writer is None:
            raise RunnerFailed(f"{self.label} is not started")
        self._writer.write(data)

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise self._dead

    def _failure(self, message: dict[str, Any], explained: bool) -> Exception:
        """The exception an ``error`` reply stands for; ``explained`` with the
        runner's last error line on stderr (a load's: llama.cpp says why
        there). Never a request's: with other requests in flight the line
        may be another user's."""
        try:
            error = read(Error, message)
        except ProtocolError as e:
            return RunnerFailed(f"the runner's error could not be read: {e}")
        if error.kind == INVALID:
            return InvalidRequest(error.error)
        if error.kind == ALLOCATION:
            return AllocationFailed(error.error)
        return RunnerFailed(self._explain(error.error) if explained else error.error)

    def _explain(self, error: str) -> str:
        if self.last_error and self.last_error not in error:
            return f"{error} ({self.last_error})"
        return error

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    message = decode(line)
                except ValueError:
                    log.warning("%s sent a malformed message: %r", self.label, line[:200])
                    continue
                rid = message.get("id", -1)
                queue = self._pending.get(rid)
                if queue is None:
                    continue
                # the bytes already waiting: one large reply (a context's tokens, up
                # to STREAM_LIMIT) still goes to a reader that keeps up
                waiting = self._backlog.get(rid, 0)
                held = waiting + len(line)
                self._backlog[rid] = held
                if queue.qsize() >= MAX_BACKLOG or waiting > MAX_BACKLOG_BYTES:
                    del self._pending[rid]  # the reader stopped: stop the request
                    queue.put_nowait(backlog_error(rid, queue.qsize(), held))
                    with contextlib.suppress(Exception):
                        self._send({"id": 0, "op": "cancel", "target": rid})
                    continue
                queue.put_nowait(message)
        except (ConnectionError, ValueError, asyncio.LimitOverrunError) as e:
            level = logging.DEBUG if self._closing else logging.WARNING
            log.log(level, "%s channel failed: %s", self.label, e)
        finally:
            await self._on_exit()

    async def _on_exit(self) -> None:
        """The channel closed: the runner is gone. Fail everything waiting on it."""
        assert self._proc is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._proc.wait(), 2.0)
        if self._proc.returncode is None:
            self.kill()
            await self._proc.wait()
        code = self._proc.returncode
        # let the stderr reader catch the last lines before we quote them
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._tasks[1]), 1.0)
        if self._stop_reason is not None:
            self._dead = self._stop_reason  # closed on purpose, and told why
        elif self._kill_reason:
            self._dead = RunnerFailed(f"{self.label} process {self._kill_reason} and was killed")
        else:
            self._dead = RunnerFailed(self._explain(f"{self.label} process {describe_exit(code)}"))
        for queue in self._pending.values():
            queue.put_nowait(_EOF)
        self._exited.set()
        log.debug("%s exited: %s", self.label, self._dead)

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        stream = self._proc.stderr
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # an over-long line: skip it
                continue
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            # once requests run, a line may quote one (a grammar's parse error
            # holds a user's schema): only a crash's is kept for the exit message
            if is_crash_line(line) if self.loaded else is_error_line(line):
                self.last_error = line.strip()
            log.debug("[%s %s] %s", self.label, self.pid, line)


def describe_exit(code: int | None) -> str:
    """'was killed by SIGKILL', 'exited with status 3'."""
    if code is None:
        return "stopped responding"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited unexpectedly with status {code}"


def backlog_error(rid: int, replies: int, held: int) -> dict[str, Any]:
    """What a request whose reader fell ``MAX_BACKLOG`` replies (or
    ``MAX_BACKLOG_BYTES``) behind gets last."""
    return {
        "id": rid,
        "type": "error",
        "error": f"cancelled: its reader fell {replies} replies ({held:,} bytes) behind "
        "(a client not reading)",
    }
