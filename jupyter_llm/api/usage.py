"""``GET {base_url}llm/api/usage``: what the server counted per user, and per
kernel, cell and model (``jupyter_llm.usage``). ``?kernel=ID`` keeps one
kernel's cells (``%llm usage`` asks for its own), ``?user=NAME`` one user's.
Admins (a plain server's one user, or a Hub admin) read everyone's rows;
anyone else only their own: another user's name is a 403."""

from __future__ import annotations

from typing import Any

from jupyter_server.base.handlers import APIHandler
from tornado import web

from jupyter_llm.api.base import LLM, LLMHandler, authorized
from jupyter_llm.api.requests import checked
from jupyter_llm.request.origin import plain_name
from jupyter_llm.usage.accounting import visible_users
from jupyter_llm.usage.store import UsageStore


class UsageHandler(LLMHandler):
    """Reads like ``/api/ps`` (``read`` on ``llm``)."""

    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        kernel = self._name_argument("kernel")
        asked = self._name_argument("user")
        me = self.requester
        try:
            user = visible_users(me.name, me.admin, asked)
        except PermissionError as e:
            raise web.HTTPError(403, str(e)) from None
        self.write_json(usage_body(self.llm.usage, me.name, me.admin, user, kernel))

    head = get  # a probe: the same status and headers, no body

    def _name_argument(self, name: str) -> str | None:
        value = self.get_query_argument(name, None)
        return None if value is None else checked(plain_name, value, name)


def usage_body(
    store: UsageStore, me: str, admin: bool, user: str | None, kernel: str | None
) -> dict[str, Any]:
    """``{"user", "admin", "users": [...], "cells": [...]}``: the rows ``user``
    may be shown (None: everyone's), the cells of ``kernel`` only if given."""
    return {
        "user": me,
        "admin": admin,
        "users": store.user_rows(user),
        "cells": store.cell_rows(user, kernel),
    }


def handlers() -> list[tuple[str, type[APIHandler]]]:
    return [(r"api/usage", UsageHandler)]
