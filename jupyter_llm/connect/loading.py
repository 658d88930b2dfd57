"""What a client shows while its model loads, and how many requests a loaded
model serves at once; both read from ``/api/ps`` (``loading`` and each
model's ``parallel``).

``LoadWatcher`` polls in a daemon thread from the moment a request is sent
until ``stop()`` (the first token arrived, or the request ended) and hands
each new fraction to a callback; after ``stop()`` returns it never calls it
again. Used by ``%%llm``, ``jupyter llm run`` and ``jupyter_llm.map``.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from jupyter_llm.connect.endpoint import ServerEndpoint

POLL_INTERVAL = 0.25  # seconds between /api/ps polls while waiting


def display_name(model: str) -> str:
    """The name ``/api/ps`` uses for ``model`` (``demo`` is ``demo:latest``)."""
    from jupyter_llm.models.names import parse_model_name
    from jupyter_llm.request.errors import InvalidRequest

    try:
        return parse_model_name(model).display
    except InvalidRequest:
        return model


def load_progress(ps: dict[str, Any], model: str) -> float | None:
    """Pure: how far ``model``'s load has got in an ``/api/ps`` body, or None
    when it is not loading."""
    name = display_name(model)
    for item in ps.get("loading") or []:
        if isinstance(item, dict) and item.get("name") == name:
            try:
                return min(1.0, max(0.0, float(item.get("progress", 0.0))))
            except (TypeError, ValueError):
                return 0.0
    return None


def parallel_of(ps: dict[str, Any], model: str) -> int | None:
    """Pure: the requests ``model`` serves at once, if it is loaded."""
    name = display_name(model)
    for item in ps.get("models") or []:
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get("parallel", 1)
            return value if isinstance(value, int) and value > 0 else 1
    return None


def loading_text(model: str, fraction: float) -> str:
    return f"loading {model}: {fraction:.0%}"


class LoadWatcher:
    """Calls ``on_progress(fraction)`` whenever ``model``'s load moves."""

    def __init__(
        self,
        endpoint: ServerEndpoint,
        model: str,
        on_progress: Callable[[float], None],
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.on_progress = on_progress
        self.interval = interval
        self.seen: list[float] = []  # every fraction handed to on_progress
        self._stop = threading.Event()
        self._lock = threading.Lock()  # held while on_progress runs
        # the caller's context: a kernel's output from the thread goes to its cell
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._loop,), daemon=True, name="jupyter-llm-load"
        )

    def start(self) -> LoadWatcher:
        self._thread.start()
        return self

    def __enter__(self) -> LoadWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """No call to ``on_progress`` starts after this returns."""
        self._stop.set()
        with self._lock:
            pass

    def _loop(self) -> None:
        with self.endpoint.http(timeout=5.0) as client:
            while not self._stop.is_set():
                try:
                    response = client.get("api/ps")
                    fraction = load_progress(response.json(), self.model)
                except Exception:
                    fraction = None  # polling is best effort: the request shows errors
                with self._lock:
                    if self._stop.is_set():
                        return
                    if fraction is not None and (not self.seen or fraction != self.seen[-1]):
                        self.seen.append(fraction)
                        self.on_progress(fraction)
                self._stop.wait(self.interval)
