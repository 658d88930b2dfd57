"""Creating a model from a local Modelfile or ``.gguf`` file: the file lives
on the client's disk, so the client uploads the GGUF as a blob and sends
``/api/create`` (as Ollama's CLI does). Used by ``jupyter llm create`` and
``%llm create``."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

from jupyter_llm.connect.endpoint import LLMClientError, ServerEndpoint, raise_for_error


def _to_stderr(status: str) -> None:
    print(status, file=sys.stderr)


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
        body["files"] = {path.name: upload_blob(endpoint, path)}
    for event in endpoint.stream("api/create", body):
        progress(event.get("status", ""))


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
