"""``%llm usage``'s answer: this kernel's cells and the server's users from
``GET /api/usage``, as a plain-text table (``connect.views.table``) and an
HTML one. Pure functions of the JSON; every string from the server is
escaped (cell ids and user names are the clients')."""

from __future__ import annotations

import html
from typing import Any

from jupyter_llm.connect.views import table

CELL_HEADER = ["cell", "model", "requests", "tokens (prompt+generated)", "tok/s",
               "first token", "decode", "device-s"]  # fmt: skip
USER_HEADER = ["user", "model", "requests", "tokens (prompt+generated)", "tok/s",
               "first token", "decode", "device-s"]  # fmt: skip


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _figures(row: dict[str, Any]) -> list[str]:
    rate = row["tokens_per_second"]
    return [
        str(row["model"]),
        str(row["requests"]),
        f"{row['prompt_tokens']}+{row['generated_tokens']}",
        "-" if rate is None else f"{rate:.1f}",
        _seconds(row["time_to_first_token"]),
        _seconds(row["decode_seconds"]),
        f"{row['device_seconds']:.2f}",
    ]


def cell_label(row: dict[str, Any]) -> str:
    """``In [n]`` where the count is known, with the cell id's start beside it."""
    count, cell = row.get("execution_count"), str(row.get("cell", ""))
    if count is None:
        return cell or "-"
    label = f"In [{count}]"
    return label if cell in ("", label) else f"{label} {cell[:8]}"


def cell_rows(body: dict[str, Any]) -> list[list[str]]:
    return [[cell_label(r), *_figures(r)] for r in body["cells"]]


def user_rows(body: dict[str, Any]) -> list[list[str]]:
    return [[str(r["user"]), *_figures(r)] for r in body["users"]]


def usage_text(body: dict[str, Any], kernel: str) -> str:
    who = "every user (admin)" if body["admin"] else f"user {body['user']}"
    cells = table(cell_rows(body), CELL_HEADER) if body["cells"] else "no requests yet"
    users = table(user_rows(body), USER_HEADER) if body["users"] else "no requests yet"
    return f"This kernel ({kernel}):\n{cells}\n\nServer, {who}:\n{users}"


def html_table(header: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "<p>no requests yet</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return (
        f"<table class='jupyter-llm-usage'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def usage_html(body: dict[str, Any], kernel: str) -> str:
    who = "every user (admin)" if body["admin"] else f"user {body['user']}"
    return (
        f"<div><b>This kernel</b> <code>{html.escape(kernel)}</code>"
        f"{html_table(CELL_HEADER, cell_rows(body))}"
        f"<b>Server, {html.escape(who)}</b>{html_table(USER_HEADER, user_rows(body))}</div>"
    )


class UsageView:
    """A display object (``text/plain`` and ``text/html``), returned so it lands in ``Out``."""

    def __init__(self, body: dict[str, Any], kernel: str) -> None:
        self.body, self.kernel = body, kernel

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {
            "text/plain": usage_text(self.body, self.kernel),
            "text/html": usage_html(self.body, self.kernel),
        }

    def __repr__(self) -> str:
        return usage_text(self.body, self.kernel)
