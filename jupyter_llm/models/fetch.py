"""Small HTTP answers a pull reads whole (registry manifests, Hugging Face's
model API, registry tokens), each with a size cap enforced while it arrives, so
a hostile server answering 10 GB costs at most the cap in memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from jupyter_llm.request.errors import PullFailed

MAX_MANIFEST = 4 << 20
MAX_HF_API = 16 << 20  # a repo's file list with its LFS hashes
MAX_TOKEN = 1 << 20


@dataclass(frozen=True)
class Answer:
    """A response read whole: status, headers and at most ``cap`` bytes of body."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


async def read_capped(
    client: httpx.AsyncClient, method: str, url: str, cap: int, what: str, **kwargs: Any
) -> Answer:
    """``method url``, refused with ``PullFailed`` once its body passes ``cap``
    bytes (at once when the server declares more; a HEAD's length is the GET's)."""
    too_large = f"{what}: the answer is too large (more than {cap} bytes)"
    async with client.stream(method, url, **kwargs) as response:
        declared = response.headers.get("content-length", "")
        if method != "HEAD" and declared.isdigit() and int(declared) > cap:
            raise PullFailed(too_large)
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > cap:
                raise PullFailed(too_large)
            chunks.append(chunk)
        return Answer(response.status_code, response.headers, b"".join(chunks))
