"""Model names as Ollama spells them: ``[host/][namespace/]name[:tag]``.

Validation is strict because names become paths under the models directory,
and are printed in terminals and notebooks: no control character anywhere
(newlines included), and each part matched whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jupyter_llm.request.errors import InvalidRequest

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MAX_NAME_LENGTH = 350

# matched with fullmatch: "$" alone also matches before a final newline
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,253}(:[0-9]{1,5})?")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class ModelName:
    host: str
    namespace: str
    name: str
    tag: str
    # as the request wrote it ("tiny", "TINY"); not part of which model it is
    written: str = field(default="", compare=False, repr=False)

    @property
    def as_written(self) -> str:
        """What an answer's ``model`` echoes, as Ollama's ``Model: req.Model``
        does: the request's own text, else ``display``."""
        return self.written or self.display

    @property
    def display(self) -> str:
        """The short form clients show: defaults left out, the tag always present."""
        prefix = ""
        if self.host != DEFAULT_HOST:
            prefix = f"{self.host}/{self.namespace}/"
        elif self.namespace != DEFAULT_NAMESPACE:
            prefix = f"{self.namespace}/"
        return f"{prefix}{self.name}:{self.tag}"

    def manifest_parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.name, self.tag)


def parse_model_name(text: object, field: str = "model") -> ModelName:
    """Parse and validate; anything that could escape the store is an InvalidRequest."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(f"{field} is required and must be a non-empty string")
    if len(text) > MAX_NAME_LENGTH:
        raise InvalidRequest(f"invalid {field} name: longer than {MAX_NAME_LENGTH} characters")
    if _CONTROL.search(text):
        raise InvalidRequest(f"invalid {field} name {text!r}: it has a control character")
    raw = text.strip()
    if ".." in raw or "\\" in raw:
        raise InvalidRequest(f"invalid model name: {text!r}")
    rest, tag = raw, DEFAULT_TAG
    last = raw.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = raw.rsplit(":", 1)
    parts = rest.split("/")
    if len(parts) == 1:
        host, namespace, name = DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 2:
        host, namespace, name = DEFAULT_HOST, parts[0], parts[1]
    elif len(parts) == 3:
        host, namespace, name = parts
    else:
        raise InvalidRequest(f"invalid model name: {text!r}")
    if not (
        _HOST.fullmatch(host)
        and _PART.fullmatch(namespace)
        and _PART.fullmatch(name)
        and _TAG.fullmatch(tag)
    ):
        raise InvalidRequest(f"invalid model name: {text!r}")
    return ModelName(host, namespace, name, tag, raw)
