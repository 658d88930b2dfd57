"""``jupyter llm``: Ollama's everyday commands against the running server (or an
embedded engine when none runs).

    jupyter llm list | ps | pull NAME | create NAME [-f Modelfile] | rm NAME...
    jupyter llm cp SRC DST | show NAME | run NAME [PROMPT] | doctor
    jupyter llm plan NAME [--num-ctx N] [--num-gpu N]   (what a load would do now)
    jupyter llm serve   (the engine alone, as a JupyterHub service: jupyter_llm.hub)

Finding the server, the requests and what they print live in ``connect``,
shared with the ``%llm`` magics; this module parses arguments and prints.
Whatever came from the server (model text, progress, errors) is printed
through ``terminal_text``, so it cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from jupyter_llm.connect import LLMClientError, ServerEndpoint, find_server
from jupyter_llm.connect.create import create_from_path
from jupyter_llm.connect.doctor import doctor_report
from jupyter_llm.connect.loading import LoadWatcher, loading_text
from jupyter_llm.connect.terminal import terminal_text
from jupyter_llm.connect.views import (
    loaded_table,
    model_details,
    models_table,
    plan_request,
    plan_text,
)

Command = Callable[[ServerEndpoint, argparse.Namespace], int]


def cmd_list(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    print(models_table(endpoint.request("GET", "api/tags")["models"]))
    return 0


def cmd_ps(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    print(loaded_table(endpoint.request("GET", "api/ps")["models"]))
    return 0


def cmd_pull(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    bars: dict[str, Any] = {}
    status = ""
    try:
        body = {"model": args.name, "insecure": args.insecure}
        for event in endpoint.stream("api/pull", body):
            digest, total = event.get("digest"), event.get("total")
            if total:
                key = digest or event["status"]
                bar = bars.get(key)
                if bar is None:
                    bar = bars[key] = tqdm(
                        total=total,
                        desc=terminal_text(str(event["status"])),
                        unit="B",
                        unit_scale=True,
                        unit_divisor=1024,
                        leave=True,
                    )
                bar.total = total
                bar.update(event.get("completed", 0) - bar.n)
            elif event.get("status") != status:
                status = event["status"]
                tqdm.write(terminal_text(str(status)))
    finally:
        for bar in bars.values():
            bar.close()
    return 0


def cmd_create(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    create_from_path(endpoint, args.name, args.file)
    return 0


def cmd_rm(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    for name in args.names:
        endpoint.request("DELETE", "api/delete", {"model": name})
        print(f"deleted '{name}'")
    return 0


def cmd_cp(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    endpoint.request("POST", "api/copy", {"source": args.source, "destination": args.destination})
    print(f"copied '{args.source}' to '{args.destination}'")
    return 0


def cmd_show(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    info = endpoint.request("POST", "api/show", {"model": args.name})
    print(json.dumps(info, indent=2) if args.json else model_details(info))
    return 0


def cmd_plan(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    """What loading the model would do now; exits 1 when it does not fit."""
    plan = endpoint.request("POST", "api/plan", plan_request(args.name, args.num_ctx, args.num_gpu))
    print(json.dumps(plan, indent=2) if args.json else plan_text(plan))
    return 0 if plan["fits"] else 1


def cmd_run(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    options = {}
    if args.num_predict is not None:
        options["num_predict"] = args.num_predict

    def reply(messages: list[dict[str, str]]) -> str:
        parts = []
        body = {"model": args.name, "messages": messages, "options": options}
        line = LoadLine(args.name)
        watcher = LoadWatcher(endpoint, args.name, line.show).start()
        try:
            for chunk in endpoint.stream("api/chat", body):
                watcher.stop()
                line.clear()
                text = chunk.get("message", {}).get("content", "")
                parts.append(text)
                sys.stdout.write(terminal_text(text))
                sys.stdout.flush()
        finally:
            watcher.stop()
            line.clear()
        sys.stdout.write("\n")
        return "".join(parts)

    if args.prompt:
        reply([{"role": "user", "content": " ".join(args.prompt)}])
        return 0
    if not sys.stdin.isatty():  # piped input: one prompt
        reply([{"role": "user", "content": sys.stdin.read()}])
        return 0
    history: list[dict[str, str]] = []
    while True:
        try:
            line = input(">>> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if line.strip() in ("/bye", "/exit"):
            return 0
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        history.append({"role": "assistant", "content": reply(history)})


class LoadLine:
    """``loading NAME: 45%`` on stderr while the model loads: one line redrawn
    on a terminal (and erased when the answer starts), a line per change
    otherwise."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.tty = sys.stderr.isatty()
        self.shown = False

    def show(self, fraction: float) -> None:
        text = terminal_text(loading_text(self.model, fraction))
        sys.stderr.write(f"\r{text}\x1b[K" if self.tty else f"{text}\n")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        self.shown = False


def cmd_doctor(endpoint: ServerEndpoint, args: argparse.Namespace) -> int:
    data = endpoint.request("GET", "api/devices")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0 if not data.get("notices") else 1
    text, ok = doctor_report(data)
    print(terminal_text(text))
    return 0 if ok else 1


def cmd_serve(args: argparse.Namespace) -> int:
    from jupyter_llm.hub.service import main as serve

    return serve(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jupyter llm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", aliases=["ls"], help="models in the store").set_defaults(run=cmd_list)
    sub.add_parser("ps", help="loaded models").set_defaults(run=cmd_ps)
    p = sub.add_parser("pull", help="download a model (registry, hf.co/..., or a .gguf URL)")
    p.add_argument("name")
    p.add_argument("--insecure", action="store_true", help="allow plain http registries")
    p.set_defaults(run=cmd_pull)
    p = sub.add_parser("create", help="create a model from a Modelfile or a .gguf file")
    p.add_argument("name")
    p.add_argument("-f", "--file", default="Modelfile", help="Modelfile or .gguf (./Modelfile)")
    p.set_defaults(run=cmd_create)
    p = sub.add_parser("rm", help="delete models")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=cmd_rm)
    p = sub.add_parser("cp", help="copy a model")
    p.add_argument("source")
    p.add_argument("destination")
    p.set_defaults(run=cmd_cp)
    p = sub.add_parser("show", help="model details")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="everything, as JSON")
    p.set_defaults(run=cmd_show)
    p = sub.add_parser(
        "plan", help="where a model would load now, and what it would evict (loads nothing)"
    )
    p.add_argument("name")
    p.add_argument("--num-ctx", type=int, help="context length to plan for")
    p.add_argument("--num-gpu", type=int, help="layers on GPUs (-1 automatic, 0 CPU only)")
    p.add_argument("--json", action="store_true", help="the server's /api/plan, as JSON")
    p.set_defaults(run=cmd_plan)
    p = sub.add_parser("run", help="chat with a model (one prompt, or interactively)")
    p.add_argument("name")
    p.add_argument("prompt", nargs="*")
    p.add_argument("-n", "--num-predict", type=int, help="stop after N tokens")
    p.set_defaults(run=cmd_run)
    p = sub.add_parser(
        "doctor", help="GPUs the host shows vs what llama.cpp uses; exits 1 when something is wrong"
    )
    p.add_argument("--json", action="store_true", help="the server's /api/devices, as JSON")
    p.set_defaults(run=cmd_doctor)
    p = sub.add_parser("serve", help="run the engine alone, as a JupyterHub-managed service")
    p.add_argument("--url", help="listen here, http://HOST:PORT (default $JUPYTERHUB_SERVICE_URL)")
    p.add_argument(
        "--prefix", help="the API's URL prefix (default $JUPYTERHUB_SERVICE_PREFIX, /services/llm/)"
    )
    p.set_defaults(run=None, serve=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run is None:  # serve: is the server, needs none
        return args.serve(args)
    try:
        return args.run(find_server(), args)
    except LLMClientError as e:
        print(f"Error: {terminal_text(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
