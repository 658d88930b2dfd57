"""The same responses, byte for byte, to a recorded set of requests to both
APIs: a reshape of the code must not change what a client receives.

Each request's status, content type and body are compared with
``tests/api/golden/wire.json``, after the values that differ from run to run
(times, durations, ids) are replaced by their key's name. A stream's pieces
are compared joined: the runner sends the tokens ready at each flush as one
piece, so where a stream splits its text depends on the machine's load; the
pieces' text, logprobs, and every line that is not a piece are compared
byte for byte. Run with
``JUPYTER_LLM_RECORD_WIRE=1`` to record the file again, only when a change
of behaviour is meant (and say so in the commit).
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

GOLDEN = Path(__file__).parent / "golden" / "wire.json"
RECORD = os.environ.get("JUPYTER_LLM_RECORD_WIRE") == "1"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "seed": 1}
VARYING = {
    "created_at",
    "created",
    "total_duration",
    "load_duration",
    "prompt_eval_duration",
    "eval_duration",
    "expires_at",
    "modified_at",
    "system_fingerprint",
    "size_vram",
    "pid",
    "speculative",  # /api/ps: draft tokens since the server started, every test's
    # drafts are priced by the machine's measured step costs (runner/step_costs.py):
    # how many are drafted varies with its speed; the answer's tokens do not
    "draft_tokens",
    "draft_accepted",
}
GENERATED_ID = re.compile(r"^(chatcmpl|cmpl|call)[-_]")

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]

# (name, method, path, body): a JSON body, raw bytes, or None
REQUESTS: list[tuple[str, str, str, Any]] = [
    ("version", "GET", "api/version", None),
    ("tags", "GET", "api/tags", None),
    ("show", "POST", "api/show", {"model": "tiny"}),
    ("show-verbose", "POST", "api/show", {"model": "tiny", "verbose": True}),
    (
        "generate",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "Hello",
            "stream": False,
            "options": {**GREEDY, "num_predict": 8},
        },
    ),
    (
        "generate-stream",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "Hello",
            "options": {**GREEDY, "num_predict": 6},
        },
    ),
    (
        "generate-raw",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "Once",
            "raw": True,
            "stream": False,
            "options": {**GREEDY, "num_predict": 6},
        },
    ),
    (
        "generate-suffix",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "def f(",
            "suffix": "    return x",
            "stream": False,
            "options": {**GREEDY, "num_predict": 6},
        },
    ),
    (
        "generate-json",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "JSON please",
            "format": "json",
            "stream": False,
            "options": {**GREEDY, "num_predict": 12},
        },
    ),
    (
        "generate-schema",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "A person",
            "format": SCHEMA,
            "stream": False,
            "options": {**GREEDY, "num_predict": 40},
        },
    ),
    (
        "generate-logprobs",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "Hello",
            "stream": False,
            "logprobs": True,
            "top_logprobs": 2,
            "options": {**GREEDY, "num_predict": 3},
        },
    ),
    (
        "generate-stop",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "Hello",
            "stream": False,
            "options": {**GREEDY, "num_predict": 16, "stop": ["a"]},
        },
    ),
    (
        "generate-context",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "Again",
            "stream": False,
            "context": [1, 2, 3],
            "options": {**GREEDY, "num_predict": 4},
        },
    ),
    ("generate-load-only", "POST", "api/generate", {"model": "tiny"}),
    (
        "chat",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": CHAT,
            "stream": False,
            "options": {**GREEDY, "num_predict": 8},
        },
    ),
    (
        "chat-stream",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": CHAT,
            "options": {**GREEDY, "num_predict": 6},
        },
    ),
    (
        "chat-tools",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": CHAT,
            "tools": [TOOL],
            "stream": False,
            "options": {**GREEDY, "num_predict": 8},
        },
    ),
    (
        "chat-tools-model",
        "POST",
        "api/chat",
        {
            "model": "tools",
            "messages": CHAT,
            "tools": [TOOL],
            "stream": False,
            "options": {**GREEDY, "num_predict": 40},
        },
    ),
    (
        "chat-tools-model-stream",
        "POST",
        "api/chat",
        {
            "model": "tools",
            "messages": CHAT,
            "tools": [TOOL],
            "options": {**GREEDY, "num_predict": 40},
        },
    ),
    ("show-tools", "POST", "api/show", {"model": "tools"}),
    (
        "chat-schema",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": CHAT,
            "format": SCHEMA,
            "stream": False,
            "options": {**GREEDY, "num_predict": 40},
        },
    ),
    (
        "chat-logprobs-stream",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": CHAT,
            "logprobs": True,
            "top_logprobs": 1,
            "options": {**GREEDY, "num_predict": 3},
        },
    ),
    (
        "chat-think-unsupported",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": CHAT,
            "think": True,
            "stream": False,
        },
    ),
    ("embed", "POST", "api/embed", {"model": "tiny", "input": ["a cat", "a dog"]}),
    (
        "embed-truncate",
        "POST",
        "api/embed",
        {
            "model": "tiny",
            "input": "word " * 40,
            "options": {"num_ctx": 16},
        },
    ),
    ("embeddings", "POST", "api/embeddings", {"model": "tiny", "prompt": "a cat"}),
    ("ps", "GET", "api/ps", None),
    ("err-bad-json", "POST", "api/generate", b"{not json"),
    ("err-no-model", "POST", "api/generate", {"prompt": "x"}),
    ("err-unknown-model", "POST", "api/chat", {"model": "nope", "messages": CHAT}),
    (
        "err-bad-option",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "x",
            "options": {"temperature": "hot"},
        },
    ),
    (
        "unknown-option",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "x",
            "stream": False,
            "options": {**GREEDY, "temprature": 1, "num_predict": 2},
        },
    ),
    (
        "err-bad-role",
        "POST",
        "api/chat",
        {
            "model": "tiny",
            "messages": [{"role": "wizard", "content": "x"}],
        },
    ),
    (
        "err-bad-format",
        "POST",
        "api/generate",
        {
            "model": "tiny",
            "prompt": "x",
            "format": "yaml",
        },
    ),
    ("err-unknown-route", "GET", "api/nothing", None),
    ("v1-models", "GET", "v1/models", None),
    ("v1-model", "GET", "v1/models/tiny", None),
    (
        "v1-chat",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 8,
            "temperature": 0,
            "seed": 1,
        },
    ),
    (
        "v1-chat-stream",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 6,
            "temperature": 0,
            "seed": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "v1-chat-tools",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 30,
            "temperature": 0,
            "seed": 1,
            "tools": [TOOL],
            "tool_choice": "required",
        },
    ),
    (
        "v1-chat-tools-stream",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 30,
            "temperature": 0,
            "seed": 1,
            "tools": [TOOL],
            "tool_choice": "required",
            "stream": True,
        },
    ),
    (
        "v1-chat-tools-model",
        "POST",
        "v1/chat/completions",
        {
            "model": "tools",
            "messages": CHAT,
            "max_tokens": 60,
            "temperature": 0,
            "seed": 1,
            "tools": [TOOL],
            "tool_choice": "required",
        },
    ),
    (
        "v1-chat-tools-model-stream",
        "POST",
        "v1/chat/completions",
        {
            "model": "tools",
            "messages": CHAT,
            "max_tokens": 60,
            "temperature": 0,
            "seed": 1,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "stream": True,
        },
    ),
    (
        "v1-chat-tool-result",
        "POST",
        "v1/chat/completions",
        {
            "model": "tools",
            "max_tokens": 8,
            "temperature": 0,
            "seed": 1,
            "tools": [TOOL],
            "messages": [
                *CHAT,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        },
    ),
    (
        "v1-chat-schema",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 40,
            "temperature": 0,
            "seed": 1,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA},
            },
        },
    ),
    (
        "v1-chat-json",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 12,
            "temperature": 0,
            "seed": 1,
            "response_format": {"type": "json_object"},
        },
    ),
    (
        "v1-chat-logprobs",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 3,
            "temperature": 0,
            "seed": 1,
            "logprobs": True,
            "top_logprobs": 2,
        },
    ),
    (
        "v1-chat-stop",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "max_tokens": 16,
            "temperature": 0,
            "seed": 1,
            "stop": "e",
        },
    ),
    (
        "v1-completions",
        "POST",
        "v1/completions",
        {
            "model": "tiny",
            "prompt": "Hello",
            "max_tokens": 8,
            "temperature": 0,
            "seed": 1,
        },
    ),
    (
        "v1-completions-stream",
        "POST",
        "v1/completions",
        {
            "model": "tiny",
            "prompt": "Hello",
            "max_tokens": 6,
            "temperature": 0,
            "seed": 1,
            "stream": True,
        },
    ),
    (
        "v1-completions-logprobs",
        "POST",
        "v1/completions",
        {
            "model": "tiny",
            "prompt": "Hello",
            "max_tokens": 3,
            "temperature": 0,
            "seed": 1,
            "logprobs": 2,
            "echo": False,
        },
    ),
    (
        "v1-completions-suffix",
        "POST",
        "v1/completions",
        {
            "model": "tiny",
            "prompt": "def f(",
            "suffix": "    return x",
            "max_tokens": 6,
            "temperature": 0,
            "seed": 1,
        },
    ),
    ("v1-embeddings", "POST", "v1/embeddings", {"model": "tiny", "input": ["a cat", "a dog"]}),
    (
        "v1-embeddings-base64",
        "POST",
        "v1/embeddings",
        {
            "model": "tiny",
            "input": "a cat",
            "encoding_format": "base64",
        },
    ),
    ("v1-err-no-messages", "POST", "v1/chat/completions", {"model": "tiny"}),
    ("v1-err-unknown-model", "POST", "v1/chat/completions", {"model": "nope", "messages": CHAT}),
    (
        "v1-err-bad-temperature",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "temperature": "hot",
        },
    ),
    (
        "v1-err-bad-tool-choice",
        "POST",
        "v1/chat/completions",
        {
            "model": "tiny",
            "messages": CHAT,
            "tools": [TOOL],
            "tool_choice": "sometimes",
        },
    ),
    ("v1-err-unknown", "POST", "v1/assistants", {"model": "tiny", "input": "x"}),
]


def varies(key: str, value: Any) -> bool:
    return key in VARYING or (isinstance(value, str) and bool(GENERATED_ID.match(value)))


def normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (k if varies(k, v) else normalized(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def normalized_line(line: str) -> str:
    prefix = "data: " if line.startswith("data: ") else ""
    text = line[len(prefix) :]
    try:
        value = json.loads(text)
    except ValueError:
        return line
    return prefix + json.dumps(normalized(value), ensure_ascii=False, separators=(",", ":"))


def normalized_body(body: bytes, models_dir: Path) -> list[str]:
    """One entry per line (NDJSON, SSE), each JSON line with its varying
    values replaced; the key order and every other byte are kept."""
    text = body.decode("utf-8").replace(str(models_dir), "<models>")
    return [normalized_line(line) for line in text.split("\n")]


TEXT_KEYS = {"response", "content", "thinking", "text"}


def is_piece(value: Any) -> bool:
    """A stream line that only carries text (or logprobs) on: Ollama's
    ``done: false`` lines, OpenAI's chunks without a finish reason."""
    if not isinstance(value, dict):
        return False
    if "done" in value:
        return value["done"] is False
    choices = value.get("choices")
    return bool(choices) and all(c.get("finish_reason") is None for c in choices)


def joined(first: Any, then: Any, key: str = "") -> Any:
    """Two pieces as one: their texts and logprob lists joined, a choice
    list joined choice by choice, every other value the first piece's."""
    if isinstance(first, dict) and isinstance(then, dict):
        out = dict(first)
        for k, v in then.items():
            out[k] = joined(out[k], v, k) if k in out else v
        return out
    if isinstance(first, str) and isinstance(then, str) and key in TEXT_KEYS:
        return first + then
    if isinstance(first, list) and isinstance(then, list):
        if key == "choices":
            return [joined(a, b) for a, b in zip(first, then, strict=True)]
        return first + then
    return first


def canonical(body: list[str]) -> list[Any]:
    """A body's lines, with each run of stream pieces joined into one (and
    the blank lines that end SSE events left out, as many as the events)."""
    out: list[Any] = []
    piece_run = False
    for line in body:
        if not line:
            continue
        prefix = "data: " if line.startswith("data: ") else ""
        try:
            value = json.loads(line[len(prefix) :])
        except ValueError:
            out.append(line)
            piece_run = False
            continue
        if is_piece(value) and piece_run:
            out[-1] = joined(out[-1], value)
        else:
            out.append(value if is_piece(value) else line)  # the line's own bytes
        piece_run = is_piece(value)
    return out


# a float's last digits follow llama.cpp's build (its CPU kernels), not our wire
FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")


BASE64_EMBEDDING = re.compile(r'"embedding":"([A-Za-z0-9+/=]+)"')


def unpacked(b64: str) -> list[float]:
    """The little-endian float32s of OpenAI's ``encoding_format: base64``."""
    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def near(value: float) -> Any:
    return pytest.approx(value, rel=1e-4, abs=1e-6)


def floats_apart(value: Any, recorded: bool) -> Any:
    """``value`` with its floats compared to 4 significant digits: a line keeps
    its own bytes around them; a joined piece's floats, where they stand."""
    if isinstance(value, str):
        packed = [f for b64 in BASE64_EMBEDDING.findall(value) for f in unpacked(b64)]
        value = BASE64_EMBEDDING.sub('"embedding":"<base64>"', value)
        numbers = packed + [float(x) for x in FLOAT.findall(value)]
        return FLOAT.sub("<float>", value), [near(x) for x in numbers] if recorded else numbers
    if isinstance(value, float):
        return near(value) if recorded else value
    if isinstance(value, dict):
        return {k: floats_apart(v, recorded) for k, v in value.items()}
    if isinstance(value, list):
        return [floats_apart(v, recorded) for v in value]
    return value


def comparable(response: dict[str, Any], recorded: bool = False) -> dict[str, Any]:
    return {**response, "body": floats_apart(canonical(response["body"]), recorded)}


async def exchange(jp_fetch, models_dir, method: str, path: str, body: Any) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    try:
        response = await jp_fetch("llm", *path.split("/"), method=method, body=raw)
    except HTTPClientError as error:
        if error.response is None:
            raise AssertionError(f"{method} {path} {body}: {error}") from error
        response = error.response
    return {
        "status": response.code,
        "content_type": response.headers.get("Content-Type"),
        "body": normalized_body(response.body, models_dir),
    }


@pytest.fixture
def tools_model(models_dir: Path, tmp_path: Path) -> str:
    """The demo model with a Hermes tool template (Qwen 2.5's), as ``tools``."""
    from jupyter_llm.chat_formats import read_template
    from jupyter_llm.demo import DemoModelSpec, write_demo_model
    from jupyter_llm.models.store import ModelStore

    spec = DemoModelSpec(chat_template=read_template("Qwen-Qwen2.5-7B-Instruct"))
    path = write_demo_model(tmp_path / "tools.gguf", spec)
    store = ModelStore(models_dir)
    store.create("tools", {"tools.gguf": store.add_blob_from_file(path)})
    return "tools:latest"


async def test_responses_are_the_recorded_ones(jp_fetch, models_dir, installed_model, tools_model):
    seen = {}
    for name, method, path, body in REQUESTS:
        seen[name] = await exchange(jp_fetch, models_dir, method, path, body)
    if RECORD:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(seen, indent=1, ensure_ascii=False) + "\n")
        pytest.skip("recorded tests/api/golden/wire.json")
    recorded = json.loads(GOLDEN.read_text())
    assert list(seen) == list(recorded)
    for name in recorded:
        assert comparable(seen[name]) == comparable(recorded[name], recorded=True), name
