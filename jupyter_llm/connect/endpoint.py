"""``ServerEndpoint``: the HTTP address and token of a Jupyter server that runs
jupyter-llm, and the few request shapes every client needs (one JSON answer,
an NDJSON stream, the official clients). It knows nothing of how it was found."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from jupyter_llm.connect.origin import current_headers


class LLMClientError(Exception):
    """What the server (or the connection to it) said went wrong, in one line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ServerEndpoint:
    url: str  # the Jupyter server's base URL, ending in "/"
    token: str
    kind: str  # how it was found: "env", "server" or "embedded"

    @property
    def llm_url(self) -> str:
        return f"{self.url}llm"

    @property
    def headers(self) -> dict[str, str]:
        """The token, and the kernel and cell asking now (``connect.origin``)."""
        auth = {"Authorization": f"token {self.token}"} if self.token else {}
        return {**auth, **current_headers()}

    def http(self, timeout: float | None = 600.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.llm_url + "/",
            headers=self.headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def async_http(self, timeout: float | None = None) -> httpx.AsyncClient:
        """An async client; ``timeout`` None waits as long as a generation takes."""
        return httpx.AsyncClient(
            base_url=self.llm_url + "/",
            headers=self.headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """One JSON request; a server error becomes ``LLMClientError``."""
        with self.http() as client:
            try:
                response = client.request(method, path, json=body, **kwargs)
            except httpx.HTTPError as e:
                raise LLMClientError(f"cannot reach jupyter-llm at {self.llm_url}: {e}") from e
            raise_for_error(response)
            if not response.content:
                return None
            try:
                return response.json()
            except ValueError:
                return [json.loads(x) for x in response.text.splitlines() if x.strip()]

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """NDJSON objects as they arrive; an ``{"error"}`` line raises."""
        with self.http() as client:
            try:
                with client.stream("POST", path, json=body) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise_for_error(response)
                    for line in response.iter_lines():
                        if not line.strip():
                            continue
                        item = json.loads(line)
                        if "error" in item:
                            raise LLMClientError(str(item["error"]))
                        yield item
            except httpx.HTTPError as e:
                raise LLMClientError(f"connection to jupyter-llm lost: {e}") from e

    def ollama_client(self) -> Any:
        import ollama

        return ollama.Client(host=self.llm_url, headers=self.headers)

    def openai_client(self) -> Any:
        import openai

        return openai.OpenAI(
            base_url=f"{self.llm_url}/v1",
            api_key=self.token or "none",
            default_headers=current_headers(),  # the kernel and cell that made it
        )


def raise_for_error(response: httpx.Response) -> None:
    """The server's ``{"error"}`` message (Ollama's or OpenAI's shape) as ``LLMClientError``."""
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    raise LLMClientError(message or f"HTTP {response.status_code}", response.status_code)
