"""The output check: what a grammar-constrained generation wrote, parsed and
validated against the schema it was asked to follow. A grammar produces a
subset of what a schema accepts, except for the keywords it cannot enforce;
this check catches those before an answer goes out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutputFormat:
    """A grammar for the sampler and, for a schema, the schema to check against."""

    grammar: str
    schema: dict[str, Any] | None = None  # None: any JSON object
    validator: Any = None  # the jsonschema validator class the schema is valid for


def check_output(fmt: OutputFormat, text: str) -> str | None:
    """None if ``text`` parses (and validates); else what is wrong."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"output is not JSON: {e}"
    if fmt.schema is None:
        return None if isinstance(value, dict) else "output is not a JSON object"
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    # as jsonschema.validate, without checking the schema again: parse_format did
    try:
        error = best_match(fmt.validator(fmt.schema).iter_errors(value))
    except Unresolvable as e:  # a $ref to nothing, or outside the schema: the grammar ignored it
        ref = str(getattr(e, "ref", ""))[:200]
        return f"output not checked: the schema's $ref {ref!r} cannot be resolved"
    except RecursionError:  # a $ref cycle with no data between its turns
        return "output not checked: the schema's $refs recurse without end"
    if error is not None:
        return f"output does not match the schema: {error.message}"
    return None
