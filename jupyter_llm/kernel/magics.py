"""``%%llm`` and ``%llm``: parse into a typed value, then execute. The server,
the requests and what the line commands print come from ``connect``, shared
with ``jupyter llm``.

%load_ext jupyter_llm
%%llm demo -t 0.2
Explain {this} in one line.     <- braces are literal unless -i is given
"""

from __future__ import annotations

import argparse
import json
import shlex
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import HTML, Markdown, display
from traitlets import Float, Unicode

from jupyter_llm.connect import LLMClientError, ServerEndpoint, find_server
from jupyter_llm.connect.create import create_from_path
from jupyter_llm.connect.loading import LoadWatcher, loading_text
from jupyter_llm.connect.origin import set_source as set_origin_source
from jupyter_llm.connect.views import loaded_table, model_details, models_table, plan_request
from jupyter_llm.kernel.formats import structured_format
from jupyter_llm.kernel.image_inputs import ImageValueError, image_files, images_from_namespace
from jupyter_llm.kernel.markdown import safe_markdown
from jupyter_llm.kernel.origin import kernel_id
from jupyter_llm.kernel.origin import source_for as origin_source_for
from jupyter_llm.kernel.results import Chat, Generation, Metrics

HELP = """%%llm MODEL [options]   (the prompt is the cell body)
  -s/--system TEXT   -f/--format json|VAR   -o/--out VAR   --options JSON
  -t/--temperature T   --seed N   -n/--num-predict N   --num-ctx N   --keep-alive D
  --chat NAME (multi-turn)   --no-stream   -i/--interpolate ({var} from the namespace)
  --image VAR (repeatable): a PIL image, matplotlib figure, image bytes or path
  --map VAR [--concurrency N]: the cell is a template, {item} each element of the
    list or Series VAR; runs them all, as many at once as the model's slots
    (or N), with a progress bar; -o stores the results (in order)
%llm models | ps | pull NAME [--insecure] | create NAME FILE_OR_MODELFILE | rm NAME
%llm show NAME | unload NAME|--all | devices | help
%llm plan MODEL [--num-ctx N] [--num-gpu N]: what loading it would do now (loads nothing)
%llm usage: this kernel's cells (tokens, tok/s, time) and the server's users"""


class MagicUsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise MagicUsageError(message)


@dataclass
class CellArgs:
    model: str | None
    system: str | None = None
    format: str | None = None
    out: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: str | None = None
    chat: str | None = None
    stream: bool = True
    interpolate: bool = False
    map: str | None = None
    concurrency: int | None = None
    images: list[str] = field(default_factory=list)  # names of variables


def parse_cell_args(line: str) -> CellArgs:
    p = _Parser(prog="%%llm", add_help=False)
    p.add_argument("model", nargs="?")
    p.add_argument("-s", "--system")
    p.add_argument("-f", "--format")
    p.add_argument("-o", "--out")
    p.add_argument("--options")
    p.add_argument("-t", "--temperature", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("-n", "--num-predict", type=int)
    p.add_argument("--num-ctx", type=int)
    p.add_argument("--keep-alive")
    p.add_argument("--chat")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("-i", "--interpolate", action="store_true")
    p.add_argument("--map")
    p.add_argument("--concurrency", type=int)
    p.add_argument("--image", action="append", default=[])
    try:
        a = p.parse_args(shlex.split(line))
    except ValueError as e:
        raise MagicUsageError(str(e)) from None
    options: dict[str, Any] = {}
    if a.options:
        try:
            options = json.loads(a.options)
        except ValueError as e:
            raise MagicUsageError(f"--options is not JSON: {e}") from None
        if not isinstance(options, dict):
            raise MagicUsageError("--options must be a JSON object")
    for key, value in (
        ("temperature", a.temperature),
        ("seed", a.seed),
        ("num_predict", a.num_predict),
        ("num_ctx", a.num_ctx),
    ):
        if value is not None:
            options[key] = value
    return CellArgs(
        model=a.model,
        system=a.system,
        format=a.format,
        out=a.out,
        options=options,
        keep_alive=a.keep_alive,
        chat=a.chat,
        stream=not a.no_stream,
        interpolate=a.interpolate,
        map=a.map,
        concurrency=a.concurrency,
        images=a.image,
    )


def interpolate(text: str, namespace: dict[str, Any]) -> str:
    """``{name}`` from the namespace; ``{{`` stays a literal brace."""
    try:
        return string.Formatter().vformat(text, (), namespace)
    except KeyError as e:
        raise MagicUsageError(f"-i: {e.args[0]!r} is not defined") from None
    except (ValueError, IndexError, AttributeError) as e:
        raise MagicUsageError(f"-i: cannot interpolate the prompt: {e}") from None


def resolve_format(value: str | None, namespace: dict[str, Any]) -> tuple[Any, Callable | None]:
    """The ``format`` to send, and a function turning the text into ``.data``."""
    if value is None:
        return None, None
    if value == "json":
        return structured_format("json")
    if value not in namespace:
        raise MagicUsageError(f"-f: {value!r} is neither 'json' nor a variable")
    try:
        return structured_format(namespace[value])
    except TypeError:
        raise MagicUsageError(
            f"-f: {value!r} must be a dict (JSON Schema) or a pydantic model class"
        ) from None


@magics_class
class LLMMagics(Magics):
    """``%config LLMMagics.default_model = "demo"`` sets the model for bare ``%%llm``."""

    default_model = Unicode("", help="Model for %%llm without MODEL.").tag(config=True)
    refresh_interval = Float(0.1, help="Seconds between live display updates.").tag(config=True)

    def __init__(
        self, shell: Any = None, endpoint: ServerEndpoint | None = None, **kwargs: Any
    ) -> None:
        super().__init__(shell=shell, **kwargs)
        self._endpoint = endpoint
        if shell is not None:  # requests say which kernel and cell sent them
            set_origin_source(origin_source_for(shell))

    @property
    def endpoint(self) -> ServerEndpoint:
        """The server this kernel talks to, found on first use."""
        if self._endpoint is None:
            self._endpoint = find_server()
        return self._endpoint

    # -- %%llm ---------------------------------------------------------------------
    @cell_magic
    def llm(self, line: str, cell: str) -> Generation | None:
        try:
            return self._run_cell(parse_cell_args(line), cell)
        except (MagicUsageError, LLMClientError, ImageValueError) as e:
            show_error(str(e))
            return None

    def _run_cell(self, args: CellArgs, cell: str) -> Any:
        ns = self.shell.user_ns if self.shell is not None else {}
        if args.map is not None:
            return self._map_cell(args, cell, ns)
        chat = None
        if args.chat:
            chat = ns.get(args.chat)
            if not isinstance(chat, Chat):
                chat = ns[args.chat] = Chat()
        model = args.model or (chat.model if chat else None) or self.default_model
        if not model:
            raise MagicUsageError("no model: %%llm MODEL, or %config LLMMagics.default_model")
        prompt = interpolate(cell, ns) if args.interpolate else cell
        fmt, parse = resolve_format(args.format, ns)
        messages = list(chat.messages) if chat else []
        if args.system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": args.system})
        user: dict[str, Any] = {"role": "user", "content": prompt.strip()}
        if args.images:
            user["images"] = images_from_namespace(args.images, ns)
        messages.append(user)
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "options": args.options,
            "stream": True,
        }
        if fmt is not None:
            body["format"] = fmt
        if args.keep_alive is not None:
            body["keep_alive"] = args.keep_alive
        text, final = self._stream(body, live=args.stream)
        metrics = Metrics.from_final(model, final)
        data = None
        if parse is not None and metrics.done_reason == "stop":
            try:
                data = parse(text)
            except Exception as e:
                raise MagicUsageError(f"the output does not match the format: {e}") from None
        result = Generation(text=text, metrics=metrics, data=data)
        if chat is not None:
            chat.model = model
            chat.messages = [*messages, {"role": "assistant", "content": text}]
        if args.out:
            ns[args.out] = data if data is not None else text
        return result

    def _map_cell(self, args: CellArgs, cell: str, ns: dict[str, Any]) -> Any:
        """``--map VAR``: the cell as a template, one prompt per element."""
        from jupyter_llm.kernel.batch import is_series, map_prompts

        model = args.model or self.default_model
        if not model:
            raise MagicUsageError("no model: %%llm MODEL, or %config LLMMagics.default_model")
        if args.chat:
            raise MagicUsageError("--map and --chat do not go together")
        if args.map not in ns:
            raise MagicUsageError(f"--map: {args.map!r} is not defined")
        values = ns[args.map]
        if (
            isinstance(values, str | bytes | dict)
            or type(values).__name__ == "DataFrame"
            or not hasattr(values, "__iter__")
        ):
            raise MagicUsageError(f"--map: {args.map!r} must be a list or a Series")
        resolve_format(args.format, ns)  # a clear error for a bad -f, before anything runs
        images = image_files(args.images, ns)

        def render(item: Any) -> str:
            if args.interpolate:
                return interpolate(cell, {**ns, "item": item}).strip()
            return cell.replace("{item}", str(item)).strip()

        prompts = values.map(render) if is_series(values) else [render(v) for v in values]
        target = None if args.format in (None, "json") else ns[args.format]
        try:
            results = map_prompts(
                model,
                prompts,
                system=args.system,
                format=args.format if target is None else target,
                options=args.options,
                concurrency=args.concurrency,
                keep_alive=args.keep_alive,
                images=images or None,
                progress=args.stream,
                endpoint=self.endpoint,
            )
        except (TypeError, ValueError) as e:
            raise MagicUsageError(f"--map: {e}") from None
        if args.out:
            ns[args.out] = results
        return results

    def _stream(self, body: dict[str, Any], live: bool) -> tuple[str, dict[str, Any]]:
        """Text and the final chunk; shown live in one display, throttled. Until
        the first chunk, a model that is loading shows its progress there."""
        handle = display(Markdown("…"), display_id=True) if live else None
        parts: list[str] = []
        final: dict[str, Any] = {"done_reason": "cancel"}
        shown = 0.0
        watcher = LoadWatcher(
            self.endpoint,
            body["model"],
            lambda f: handle.update(Markdown(f"*{loading_text(body['model'], f)}*")),
        )
        try:
            if handle is not None:
                watcher.start()
            for chunk in self.endpoint.stream("api/chat", body):
                watcher.stop()
                if chunk.get("done"):
                    final = chunk
                    break
                parts.append(chunk.get("message", {}).get("content", ""))
                now = time.monotonic()
                if handle is not None and now - shown >= self.refresh_interval:
                    handle.update(Markdown(safe_markdown("".join(parts))))
                    shown = now
        except KeyboardInterrupt:
            pass  # leaving the stream closes the connection: the server cancels
        finally:
            watcher.stop()
            if handle is not None:
                handle.update(HTML(""))  # the returned Generation shows the result
        return "".join(parts), final

    # -- %llm ----------------------------------------------------------------------
    @line_magic("llm")
    def llm_line(self, line: str) -> Any:
        words = shlex.split(line)
        command, rest = (words[0], words[1:]) if words else ("help", [])
        handler = getattr(self, f"_cmd_{command.replace('-', '_')}", None)
        if handler is None:
            show_error(f"unknown command {command!r}; %llm help lists them")
            return None
        try:
            return handler(rest)
        except (MagicUsageError, LLMClientError) as e:
            show_error(str(e))
            return None

    def _cmd_help(self, rest: list[str]) -> None:
        print(HELP)

    def _cmd_models(self, rest: list[str]) -> None:
        print(models_table(self.endpoint.request("GET", "api/tags")["models"]))

    def _cmd_ps(self, rest: list[str]) -> None:
        print(loaded_table(self.endpoint.request("GET", "api/ps")["models"]))

    def _cmd_show(self, rest: list[str]) -> None:
        name = _one(rest, "show NAME")
        print(model_details(self.endpoint.request("POST", "api/show", {"model": name})))

    def _cmd_rm(self, rest: list[str]) -> None:
        for name in rest or [_one(rest, "rm NAME")]:
            self.endpoint.request("DELETE", "api/delete", {"model": name})
            print(f"deleted '{name}'")

    def _cmd_create(self, rest: list[str]) -> None:
        if len(rest) != 2:
            raise MagicUsageError("usage: %llm create NAME FILE_OR_MODELFILE")
        create_from_path(self.endpoint, *rest)
        print(f"created '{rest[0]}'")

    def _cmd_pull(self, rest: list[str]) -> None:
        import ipywidgets as w

        insecure = "--insecure" in rest
        name = _one([r for r in rest if r != "--insecure"], "pull NAME [--insecure]")
        bar = w.FloatProgress(
            value=0, min=0, max=1, description="pulling", layout=w.Layout(width="60%")
        )
        label = w.Label("")
        display(w.HBox([bar, label]))
        for event in self.endpoint.stream("api/pull", {"model": name, "insecure": insecure}):
            label.value = event.get("status", "")
            if event.get("total"):
                bar.value = event.get("completed", 0) / event["total"]
        bar.value, bar.bar_style = 1, "success"

    def _cmd_unload(self, rest: list[str]) -> None:
        if rest == ["--all"]:
            names = [m["name"] for m in self.endpoint.request("GET", "api/ps")["models"]]
        else:
            names = [_one(rest, "unload NAME|--all")]
        for name in names:
            self.endpoint.request("POST", "api/generate", {"model": name, "keep_alive": 0})
            print(f"unloaded '{name}'")

    def _cmd_plan(self, rest: list[str]) -> Any:
        from jupyter_llm.kernel.plan_view import PlanView

        body = parse_plan_args(rest, "%llm plan")
        plan = self.endpoint.request("POST", "api/plan", body)
        return PlanView(plan, self.endpoint.request("GET", "api/ps")["models"])

    def _cmd_usage(self, rest: list[str]) -> Any:
        from jupyter_llm.kernel.usage_view import UsageView

        kernel = kernel_id(self.shell)
        body = self.endpoint.request("GET", "api/usage", params={"kernel": kernel})
        return UsageView(body, kernel)

    def _cmd_devices(self, rest: list[str]) -> Any:
        from jupyter_llm.kernel.widgets import DeviceDashboard

        return DeviceDashboard(self.endpoint)


def parse_plan_args(words: list[str], prog: str) -> dict[str, Any]:
    """``MODEL [--num-ctx N] [--num-gpu N]`` as an ``/api/plan`` body."""
    p = _Parser(prog=prog, add_help=False)
    p.add_argument("model")
    p.add_argument("--num-ctx", type=int)
    p.add_argument("--num-gpu", type=int)
    a = p.parse_args(words)
    return plan_request(a.model, a.num_ctx, a.num_gpu)


def _one(rest: list[str], usage: str) -> str:
    if len(rest) != 1:
        raise MagicUsageError(f"usage: %llm {usage}")
    return rest[0]


def show_error(message: str) -> None:
    """One red line, no traceback."""
    import html

    display(
        {
            "text/plain": f"Error: {message}",
            "text/html": f'<span style="color:#c62828">Error: {html.escape(message)}</span>',
        },
        raw=True,
    )
