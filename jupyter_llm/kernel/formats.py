"""Structured output for the kernel: what ``format`` to send for ``"json"``, a
JSON Schema dict or a pydantic model class, and the function that turns the
answer's text into the value (validated against the schema). Shared by
``%%llm -f`` and ``jupyter_llm.map``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def structured_format(target: Any) -> tuple[Any, Callable[[str], Any]]:
    """``(format, parse)`` for ``target``; anything else is a ``TypeError``."""
    if target == "json":
        return "json", json.loads
    if isinstance(target, dict):
        import jsonschema

        def parse(text: str) -> Any:
            data = json.loads(text)
            jsonschema.validate(data, target)
            return data

        return target, parse
    if isinstance(target, type) and hasattr(target, "model_json_schema"):
        return target.model_json_schema(), target.model_validate_json
    raise TypeError("must be 'json', a dict (JSON Schema) or a pydantic model class")
