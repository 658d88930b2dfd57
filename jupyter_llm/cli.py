"""``jupyter llm``: Ollama's everyday commands against the running server (or an
embedded engine when none runs).

    jupyter llm list | ps | pull NAME | create NAME [-f Modelfile] | rm NAME...
    jupyter llm cp SRC DST | show NAME | run NAME [PROMPT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jupyter_llm.kernel.connection import Engine, LLMClientError, find_engine
from jupyter_llm.kernel.ps import processor

Command = Callable[[Engine, argparse.Namespace], int]


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def ago(iso: str) -> str:
    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    seconds = (datetime.now(UTC) - then).total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    )


def cmd_list(engine: Engine, args: argparse.Namespace) -> int:
    models = engine.request("GET", "api/tags")["models"]
    rows = [
        [m["name"], m["digest"][:12], human_size(m["size"]), ago(m["modified_at"])] for m in models
    ]
    print(table(rows, ["NAME", "ID", "SIZE", "MODIFIED"]))
    return 0


def cmd_ps(engine: Engine, args: argparse.Namespace) -> int:
    models = engine.request("GET", "api/ps")["models"]
    rows = [
        [
            m["name"],
            m["digest"][:12],
            human_size(m["size"]),
            processor(m),
            str(m.get("context_length", "")),
            m.get("expires_at", ""),
        ]
        for m in models
    ]
    print(table(rows, ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]))
    return 0


def cmd_pull(engine: Engine, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    bars: dict[str, Any] = {}
    status = ""
    try:
        body = {"model": args.name, "insecure": args.insecure}
        for event in engine.stream("api/pull", body):
            digest, total = event.get("digest"), event.get("total")
            if total:
                key = digest or event["status"]
                bar = bars.get(key)
                if bar is None:
                    bar = bars[key] = tqdm(
                        total=total,
                        desc=event["status"],
                        unit="B",
                        unit_scale=True,
                        unit_divisor=1024,
                        leave=True,
                    )
                bar.total = total
                bar.update(event.get("completed", 0) - bar.n)
            elif event.get("status") != status:
                status = event["status"]
                tqdm.write(status)
    finally:
        for bar in bars.values():
            bar.close()
    return 0


def upload_blob(engine: Engine, path: Path) -> str:
    """HEAD then POST /api/blobs/sha256:<hex>, streaming the file."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    digest = f"sha256:{sha.hexdigest()}"
    with engine.http() as client:
        if client.head(f"api/blobs/{digest}").status_code == 200:
            return digest
        with open(path, "rb") as f:
            response = client.post(
                f"api/blobs/{digest}", content=iter(lambda: f.read(1 << 20), b"")
            )
    if response.status_code >= 400:
        raise LLMClientError(response.json().get("error", f"HTTP {response.status_code}"))
    return digest


def create_from_modelfile(engine: Engine, name: str, text: str, base_dir: Path) -> None:
    """Create ``name`` from a Modelfile's text, uploading its GGUF when FROM is a file."""
    from jupyter_llm.errors import InvalidRequest
    from jupyter_llm.models.modelfile import parse_modelfile

    try:
        modelfile = parse_modelfile(text)
    except InvalidRequest as e:
        raise LLMClientError(str(e)) from None
    body = modelfile.create_request(name)
    if modelfile.from_file:
        path = (base_dir / Path(modelfile.source).expanduser()).resolve()
        if not path.is_file():
            raise LLMClientError(f"FROM {modelfile.source}: no such file")
        body["files"] = {path.name: upload_blob(engine, path)}
    for event in engine.stream("api/create", body):
        print(event.get("status", ""), file=sys.stderr)


def create_from_path(engine: Engine, name: str, source: str) -> None:
    """Create ``name`` from a Modelfile, or straight from a ``.gguf`` file."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        text, base = f"FROM {path.resolve()}", Path.cwd()
    else:
        try:
            text, base = path.read_text(), path.resolve().parent
        except OSError as e:
            raise LLMClientError(f"cannot read {source}: {e.strerror}") from None
    create_from_modelfile(engine, name, text, base)


def cmd_create(engine: Engine, args: argparse.Namespace) -> int:
    create_from_path(engine, args.name, args.file)
    return 0


def cmd_rm(engine: Engine, args: argparse.Namespace) -> int:
    for name in args.names:
        engine.request("DELETE", "api/delete", {"model": name})
        print(f"deleted '{name}'")
    return 0


def cmd_cp(engine: Engine, args: argparse.Namespace) -> int:
    engine.request("POST", "api/copy", {"source": args.source, "destination": args.destination})
    print(f"copied '{args.source}' to '{args.destination}'")
    return 0


def cmd_show(engine: Engine, args: argparse.Namespace) -> int:
    info = engine.request("POST", "api/show", {"model": args.name})
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    d, mi = info["details"], info["model_info"]
    arch = mi.get("general.architecture", d.get("family", ""))
    print("  Model")
    for label, value in (
        ("architecture", arch),
        ("parameters", d.get("parameter_size")),
        ("context length", mi.get(f"{arch}.context_length")),
        ("embedding length", mi.get(f"{arch}.embedding_length")),
        ("quantization", d.get("quantization_level")),
    ):
        print(f"    {label:<20}{value}")
    print("\n  Capabilities")
    for capability in info.get("capabilities", []):
        print(f"    {capability}")
    if info.get("parameters"):
        print("\n  Parameters")
        for line in info["parameters"].splitlines():
            print(f"    {line}")
    if info.get("system"):
        print("\n  System\n    " + info["system"].strip().replace("\n", "\n    "))
    if info.get("license"):
        print("\n  License\n    " + info["license"].strip().splitlines()[0])
    return 0


def cmd_run(engine: Engine, args: argparse.Namespace) -> int:
    options = {}
    if args.num_predict is not None:
        options["num_predict"] = args.num_predict

    def reply(messages: list[dict[str, str]]) -> str:
        parts = []
        for chunk in engine.stream(
            "api/chat", {"model": args.name, "messages": messages, "options": options}
        ):
            text = chunk.get("message", {}).get("content", "")
            parts.append(text)
            sys.stdout.write(text)
            sys.stdout.flush()
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
    p = sub.add_parser("run", help="chat with a model (one prompt, or interactively)")
    p.add_argument("name")
    p.add_argument("prompt", nargs="*")
    p.add_argument("-n", "--num-predict", type=int, help="stop after N tokens")
    p.set_defaults(run=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        engine = find_engine()
        return args.run(engine, args)
    except LLMClientError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
