"""What a shapes test compares of a ``GenerationRequest``: the fields a
body set, against a request made of nothing."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from jupyter_llm.models.names import parse_model_name

NOT_SET = {
    "options": {},
    "keep_alive": None,
    "prompt": None,
    "images": [],
    "messages": None,
    "tools": None,
    "context": None,
    "suffix": None,
    "format": None,
    "think": None,
    "relax_think": False,
    "logprobs": None,
    "tool_choice": None,
    "parallel_tool_calls": None,
    "truncate": True,
    "shift": True,
    "priority": None,
    "whole": False,  # set by the handler that holds the answer, not by a shape
}


def fields(call: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request's fields that differ from an empty one (whose options are
    ``options``: an API's defaults), the format as its kind."""
    not_set = {**NOT_SET, "options": options or {}}
    got = asdict(call.generation)
    assert got.pop("model") == asdict(parse_model_name("m"))
    got.pop("route")  # which route asked: the shapes tests name it apart (test_embedding_only)
    got.pop("with_context")  # Ollama's generate alone: test_embedding_only too
    if got["format"] is not None:
        got["format"] = "set"
    return {k: v for k, v in got.items() if v != not_set[k]}
