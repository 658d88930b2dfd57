"""A POST on a raw connection the test can close mid-request (a client that
leaves), or never read (a client that stalls)."""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def open_post(
    port: int, base_url: str, token: str, path: str, body: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``body`` as JSON to ``{base_url}llm/{path}``, sent; nothing read."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {base_url}llm/{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: token {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    return reader, writer
