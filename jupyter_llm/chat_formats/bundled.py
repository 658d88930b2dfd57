"""The real chat templates shipped in ``templates/`` (see its README), for
tests and generated demo models that should carry a family's template."""

from __future__ import annotations

from importlib.resources import files


def template_names() -> list[str]:
    """The bundled templates' names (file names without ``.jinja``)."""
    folder = files("jupyter_llm.chat_formats") / "templates"
    return sorted(
        p.name.removesuffix(".jinja") for p in folder.iterdir() if p.name.endswith(".jinja")
    )


def read_template(name: str) -> str:
    """A bundled template's source; ``KeyError`` for a name not bundled."""
    if name not in template_names():
        raise KeyError(f"no bundled chat template {name!r}")
    return (files("jupyter_llm.chat_formats") / "templates" / f"{name}.jinja").read_text(
        encoding="utf-8"
    )
