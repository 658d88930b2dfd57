"""``jupyter_llm.map``: many prompts through one model, as many at once as the
model has slots, with a progress bar.

The requests run on an asyncio loop in a thread of their own (a notebook's
main thread may already run one); the calling thread only draws the bar and
waits, so the stop button (``KeyboardInterrupt``) lands there: it cancels
the loop's tasks, which closes their HTTP requests, and the server cancels
those generations. What finished is returned; the rest are ``MapError``s.

    results = jupyter_llm.map("demo", ["a haiku about rain", "one about snow"])
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

import httpx

from jupyter_llm.connect import LLMClientError, ServerEndpoint, find_server
from jupyter_llm.connect.endpoint import raise_for_error
from jupyter_llm.connect.loading import LoadWatcher, loading_text, parallel_of
from jupyter_llm.kernel.formats import structured_format
from jupyter_llm.kernel.image_inputs import images_base64
from jupyter_llm.kernel.results import Metrics
from jupyter_llm.request.priority import BATCH, PRIORITIES

CANCEL_WAIT = 30.0  # seconds to wait for the cancelled requests to close
_PENDING = object()  # a result not in yet


class MapError(Exception):
    """Stands in the results for an item that failed or was cancelled."""

    def __init__(self, index: int, message: str, cancelled: bool = False) -> None:
        super().__init__(message)
        self.index = index
        self.message = message
        self.cancelled = cancelled

    def __repr__(self) -> str:
        return f"MapError(item {self.index}: {self.message})"


@dataclass(frozen=True)
class Item:
    """One prompt and what it adds to the call's system prompt, options and
    images (base64; the item's own replace the call's)."""

    prompt: str
    system: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    images: tuple[str, ...] = ()


class MapResults(list):
    """The results in input order (a list), with ``errors`` (position ->
    ``MapError``), a one-line ``summary``, each item's ``metrics`` (None for
    a failed one) and the ``concurrency`` it ran at."""

    def __init__(
        self, values: list[Any], metrics: list[Metrics | None], concurrency: int | None
    ) -> None:
        super().__init__(values)
        self.metrics = metrics
        self.concurrency = concurrency

    @property
    def errors(self) -> dict[int, MapError]:
        return {i: v for i, v in enumerate(self) if isinstance(v, MapError)}

    @property
    def summary(self) -> str:
        return summarize(list(self))


def summarize(values: list[Any]) -> str:
    """Pure: ``"10 items: 8 done, 1 failed, 1 cancelled; item 3: <message>"``."""
    errors = [v for v in values if isinstance(v, MapError)]
    failed = [e for e in errors if not e.cancelled]
    cancelled = len(errors) - len(failed)
    line = f"{len(values)} items: {len(values) - len(errors)} done"
    if failed:
        line += f", {len(failed)} failed"
    if cancelled:
        line += f", {cancelled} cancelled"
    if failed:
        line += f"; item {failed[0].index}: {failed[0].message}"
    return line


def to_items(prompts: Iterable[Any]) -> list[Item]:
    """Each prompt is a string, or a dict with ``prompt`` and optionally
    ``system``, ``options`` (merged over the call's) and ``images`` (one image
    or a list, as ``kernel.image_inputs`` reads them; they replace the call's)."""
    items = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            items.append(Item(p))
            continue
        if not isinstance(p, dict) or not isinstance(p.get("prompt"), str):
            raise TypeError(f"item {i}: a prompt is a string or a dict with a 'prompt' string")
        unknown = set(p) - {"prompt", "system", "options", "images"}
        if unknown:
            raise TypeError(f"item {i}: unknown keys {sorted(unknown)}")
        options = p.get("options") or {}
        if not isinstance(options, dict):
            raise TypeError(f"item {i}: 'options' must be a dict")
        try:
            images = tuple(images_base64(p.get("images"), f"item {i}: images"))
        except ValueError as e:
            raise TypeError(str(e)) from None
        items.append(Item(p["prompt"], p.get("system"), dict(options), images))
    return items


def request_body(
    model: str,
    item: Item,
    *,
    mode: str,
    system: str | None,
    options: dict[str, Any],
    fmt: Any,
    keep_alive: Any,
    images: list[str] | tuple[str, ...] = (),
    priority: str = BATCH,
) -> tuple[str, dict[str, Any]]:
    """Pure: the path and body of one item's request (not streamed).
    ``images``: the call's, base64; an item's own replace them. ``priority``:
    batch, so that a colleague's ``%%llm`` goes first (``request.priority``)."""
    system = item.system if item.system is not None else system
    images = list(item.images or images)
    body: dict[str, Any] = {"model": model, "stream": False, "options": {**options, **item.options}}
    body["priority"] = priority
    if mode == "chat":
        messages = [{"role": "system", "content": system}] if system else []
        user: dict[str, Any] = {"role": "user", "content": item.prompt}
        if images:
            user["images"] = images
        body["messages"] = [*messages, user]
        path = "api/chat"
    else:
        body["prompt"] = item.prompt
        if images:
            body["images"] = images
        if system:
            body["system"] = system
        path = "api/generate"
    if fmt is not None:
        body["format"] = fmt
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    return path, body


def map_prompts(
    model: str,
    prompts: Iterable[Any],
    *,
    system: str | None = None,
    format: Any = None,
    options: dict[str, Any] | None = None,
    mode: str = "chat",
    concurrency: int | None = None,
    keep_alive: Any = None,
    images: Any = None,
    progress: bool | IO[str] = True,
    on_result: Callable[[int, Any], None] | None = None,
    endpoint: ServerEndpoint | None = None,
    priority: str = BATCH,
) -> Any:
    """Run every prompt through ``model``; results in input order.

    ``prompts``: a list (or any iterable) or a pandas Series of strings, or of
    dicts with ``prompt`` and optional ``system``/``options``. ``format``:
    ``"json"``, a JSON Schema dict or a pydantic model class; each result is
    then the parsed value (a model instance for a class). ``mode``: ``"chat"``
    or ``"generate"``. ``concurrency``: requests at once (default: the
    model's slots, ``parallel`` in ``/api/ps``, once it is loaded).
    ``images``: an image or a list (PIL images, matplotlib figures, image
    bytes or paths) sent with every prompt, e.g. many questions about one
    figure; an item's own ``images`` replace them.
    ``progress``: a bar (tqdm: a widget in a notebook, text in a terminal),
    False for none, or a text file to draw it in. ``on_result(position,
    value)`` is called (in this thread) as each item ends, e.g. to save it.
    ``priority``: ``"batch"`` (the default: interactive requests, such as a
    colleague's ``%%llm``, go first and may pause these) or ``"interactive"``.

    A failed item is a ``MapError`` in its place (the others are kept); the
    stop button cancels the run and returns what finished. A list comes back
    as ``MapResults`` (``.errors``, ``.summary``), a Series as a Series with
    the same index."""
    _check_run(mode, concurrency, priority)
    series = prompts if is_series(prompts) else None
    items = to_items(list(prompts))
    fmt, parse = structured_format(format) if format is not None else (None, None)
    options = dict(options or {})
    shape = dict(
        mode=mode, system=system, options=options, fmt=fmt, keep_alive=keep_alive, priority=priority
    )
    body = partial(request_body, model, images=images_base64(images), **shape)
    field = "message" if mode == "chat" else "response"
    server = endpoint or find_server()
    run = BatchRun(server, model, items, body, field, parse, concurrency, options, on_result)
    values = run.wait(progress) if items else []
    if any(isinstance(v, MapError) for v in values):
        print(f"map: {summarize(values)}", file=sys.stderr)
    return _results(values, series, run)


def _check_run(mode: str, concurrency: int | None, priority: str = BATCH) -> None:
    if mode not in ("chat", "generate"):
        raise ValueError("mode must be 'chat' or 'generate'")
    if priority not in PRIORITIES:
        raise ValueError("priority must be 'batch' or 'interactive'")
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError("concurrency must be a positive integer")


def _results(values: list[Any], series: Any, run: BatchRun) -> Any:
    """A Series for a Series (same index and name), else ``MapResults``."""
    if series is not None:
        import pandas

        result = pandas.Series(values, index=series.index, name=series.name, dtype=object)
        result.attrs.update(metrics=run.metrics, concurrency=run.slots)
        return result
    return MapResults(values, run.metrics, run.slots)


def is_series(value: Any) -> bool:
    """A pandas Series (checked without importing pandas)."""
    return type(value).__name__ == "Series" and type(value).__module__.startswith("pandas")


class BatchRun:
    """The requests of one ``map``, on a loop in a thread; events come back to
    the waiting thread through a queue."""

    def __init__(
        self,
        endpoint: ServerEndpoint,
        model: str,
        items: list[Item],
        body: Callable[[Item], tuple[str, dict[str, Any]]],
        field_name: str,
        parse: Callable[[str], Any] | None,
        concurrency: int | None,
        load_options: dict[str, Any],
        on_result: Callable[[int, Any], None] | None = None,
    ) -> None:
        self.on_result = on_result
        self.endpoint = endpoint
        self.load_options = load_options
        self.model = model
        self.items = items
        self.body = body
        self.field_name = field_name
        self.parse = parse
        self.concurrency = concurrency
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.metrics: list[Metrics | None] = [None] * len(items)
        self.slots: int | None = None  # requests at once, once known
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the waiting thread ----------------------------------------------------------
    def wait(self, progress: bool | IO[str]) -> list[Any]:
        values: list[Any] = [_PENDING] * len(self.items)
        bar = _bar(len(self.items), self.model, progress) if progress else None
        thread = threading.Thread(target=self._thread, daemon=True, name="jupyter-llm-map")
        thread.start()
        failure: BaseException | None = None
        try:
            failure = self._consume(values, bar)
        except KeyboardInterrupt:
            self.cancel()
            try:
                failure = self._consume(values, bar, timeout=CANCEL_WAIT)
            except KeyboardInterrupt:
                pass  # a second stop: stop waiting for the requests to close
            if bar is not None:
                bar.set_description_str(f"{self.model}: interrupted")
        finally:
            if bar is not None:
                bar.close()
        if failure is not None:
            raise failure
        return [
            MapError(i, "cancelled", cancelled=True) if v is _PENDING else v
            for i, v in enumerate(values)
        ]

    def _consume(
        self, values: list[Any], bar: Any, timeout: float | None = None
    ) -> BaseException | None:
        """Apply events until the run ends; its failure, if it failed as a whole."""
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                return None
            kind = event[0]
            if kind == "end":
                return event[1]
            if kind == "item":
                _, index, value = event
                values[index] = value
                if self.on_result is not None:
                    self.on_result(index, value)
                if bar is not None:
                    bar.update(1)
                    if errors := sum(isinstance(v, MapError) for v in values):
                        bar.set_postfix_str(f"{errors} failed")
            elif bar is not None and kind == "loading":
                bar.set_description_str(loading_text(self.model, event[1]))
            elif kind == "slots":
                self.slots = event[1]
                if bar is not None:
                    bar.set_description_str(f"{self.model} ({event[1]} at once)")

    def cancel(self) -> None:
        """Cancel the requests (from any thread): their connections close."""
        self._ready.wait()
        if self._loop is not None and self._task is not None:
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:
                pass  # the run has ended: its loop is closed

    # -- the loop's thread -----------------------------------------------------------
    def _thread(self) -> None:
        loop = asyncio.new_event_loop()
        failure: BaseException | None = None
        try:
            self._loop, self._task = loop, loop.create_task(self._run())
            self._ready.set()
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # handed to the waiting thread, raised there
            failure = e
        finally:
            self._ready.set()
            loop.close()
            self.events.put(("end", failure))

    async def _run(self) -> None:
        async with self.endpoint.async_http(timeout=None) as client:
            slots = await self._load(client)
            self.events.put(("slots", slots))
            gate = asyncio.Semaphore(slots)

            async def one(index: int, item: Item) -> None:
                async with gate:
                    value = await self._one(client, index, item)
                self.events.put(("item", index, value))

            await asyncio.gather(*(one(i, item) for i, item in enumerate(self.items)))

    async def _load(self, client: httpx.AsyncClient) -> int:
        """Load the model (an empty generate, showing the load's progress) and
        return how many requests to run at once."""
        warm = {"model": self.model, "options": self.load_options, "stream": False}
        with LoadWatcher(self.endpoint, self.model, lambda f: self.events.put(("loading", f))):
            raise_for_error(await _post(client, "api/generate", warm))
        if self.concurrency is not None:
            return self.concurrency
        response = await client.get("api/ps")
        raise_for_error(response)
        return parallel_of(response.json(), self.model) or 1

    async def _one(self, client: httpx.AsyncClient, index: int, item: Item) -> Any:
        path, body = self.body(item)
        try:
            response = await _post(client, path, body)
            raise_for_error(response)
            reply = response.json()
        except LLMClientError as e:
            return MapError(index, str(e))
        except ValueError as e:
            return MapError(index, f"the server's answer is not JSON: {e}")
        self.metrics[index] = Metrics.from_final(self.model, reply)
        text = reply.get(self.field_name)
        if isinstance(text, dict):
            text = text.get("content", "")
        text = text if isinstance(text, str) else ""
        if self.parse is None:
            return text
        try:
            return self.parse(text)
        except Exception as e:
            return MapError(index, f"the output does not match the format: {e}")


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    try:
        return await client.post(path, json=body)
    except httpx.HTTPError as e:
        raise LLMClientError(f"connection to jupyter-llm lost: {e}") from e


def _bar(total: int, model: str, progress: bool | IO[str]) -> Any:
    if progress is True:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    file = None if progress is True else progress
    return tqdm(total=total, desc=model, unit="item", file=file)
