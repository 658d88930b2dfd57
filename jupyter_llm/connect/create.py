"""Creating a model from a local Modelfile or ``.gguf`` file: the file lives
on the client's disk, so the client uploads the GGUF as a blob and sends
``/api/create`` (as Ollama's CLI does). Used by ``jupyter llm create`` and
``%llm create``.

A vision model's projector travels with it: a second ``FROM`` file, or else
the mmproj file next to the GGUF (``find_projector``). The server tells the
two apart by their headers. A ``DRAFT`` file is uploaded too and sent as
``draft``, its digest."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

from jupyter_llm.connect.endpoint import LLMClientError, ServerEndpoint, raise_for_error
from jupyter_llm.connect.terminal import terminal_text


def _to_stderr(status: str) -> None:
    """A server's status line, printed as text (it may carry escapes)."""
    print(terminal_text(str(status)), file=sys.stderr)


def upload_blob(endpoint: ServerEndpoint, path: Path) -> str:
    """HEAD then POST /api/blobs/sha256:<hex>, streaming the file."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    digest = f"sha256:{sha.hexdigest()}"
    with endpoint.http() as client:
        if client.head(f"api/blobs/{digest}").status_code == 200:
            return digest
        with open(path, "rb") as f:
            response = client.post(
                f"api/blobs/{digest}", content=iter(lambda: f.read(1 << 20), b"")
            )
    raise_for_error(response)
    return digest


def create_from_modelfile(
    endpoint: ServerEndpoint,
    name: str,
    text: str,
    base_dir: Path,
    progress: Callable[[str], None] = _to_stderr,
) -> None:
    """Create ``name`` from a Modelfile's text, uploading its GGUF when FROM is
    a file (relative to ``base_dir``); ``progress`` receives each status line."""
    from jupyter_llm.models.modelfile import parse_modelfile
    from jupyter_llm.request.errors import InvalidRequest

    try:
        modelfile = parse_modelfile(text)
    except InvalidRequest as e:
        raise LLMClientError(str(e)) from None
    body = modelfile.create_request(name)
    if modelfile.from_file:
        paths = [_local(base_dir, source) for source in [modelfile.source, *modelfile.more_files]]
        if not modelfile.more_files and (projector := find_projector(paths[0])):
            progress(f"using projector {projector.name}")
            paths.append(projector)
        body["files"] = {}
        for path in paths:
            if path.name in body["files"]:
                raise LLMClientError(f"FROM {path.name} is given twice")
            body["files"][path.name] = upload_blob(endpoint, path)
    if modelfile.draft is not None and modelfile.draft_file:
        body["draft"] = upload_blob(endpoint, _local(base_dir, modelfile.draft, "DRAFT"))
    for event in endpoint.stream("api/create", body):
        progress(event.get("status", ""))


def _local(base_dir: Path, source: str, command: str = "FROM") -> Path:
    path = (base_dir / Path(source).expanduser()).resolve()
    if not path.is_file():
        raise LLMClientError(f"{command} {source}: no such file")
    return path


def find_projector(model: Path) -> Path | None:
    """The projector next to a GGUF: ``mmproj-<stem>.gguf``, or else the
    folder's only ``mmproj*.gguf`` file (names compared case-insensitively).
    With several and none named for the model, none (give it as a second FROM)."""
    if model.name.lower().startswith("mmproj"):
        return None  # the projector itself
    try:
        candidates = [
            p
            for p in model.parent.iterdir()
            if p.name.lower().startswith("mmproj")
            and p.name.lower().endswith(".gguf")
            and p.is_file()
        ]
    except OSError:
        return None
    named = f"mmproj-{model.stem}.gguf".lower()
    if exact := [p for p in candidates if p.name.lower() == named]:
        return exact[0]
    return candidates[0] if len(candidates) == 1 else None


def create_from_path(
    endpoint: ServerEndpoint,
    name: str,
    source: str,
    progress: Callable[[str], None] = _to_stderr,
) -> None:
    """Create ``name`` from a Modelfile, or straight from a ``.gguf`` file."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        text, base = f"FROM {path.resolve()}", Path.cwd()
    else:
        try:
            text, base = path.read_text(), path.resolve().parent
        except OSError as e:
            raise LLMClientError(f"cannot read {source}: {e.strerror}") from None
    create_from_modelfile(endpoint, name, text, base, progress)
