"""Who sent a request: the scheduler's fair sharing and the unload rule read it.

A plain Jupyter server has one user, ``local``, who owns everything (admin).
Behind JupyterHub the handler's user carries the Hub's user model
(``hub_user``: ``name``, ``admin``, ``scopes``; jupyterhub's
``JupyterHubUser``), and a Hub admin is an admin here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Requester:
    name: str
    admin: bool = False


LOCAL = Requester("local", admin=True)


def requester_of(user: Any) -> Requester:
    """The requester behind a jupyter_server ``User`` (``LOCAL`` without a Hub)."""
    hub_user = getattr(user, "hub_user", None)
    if not isinstance(hub_user, dict) or not hub_user.get("name"):
        return LOCAL
    return Requester(str(hub_user["name"]), admin=hub_admin(hub_user))


def hub_admin(hub_user: dict[str, Any]) -> bool:
    """The Hub says so: an admin user, or a token holding ``admin:services``."""
    return bool(hub_user.get("admin")) or "admin:services" in (hub_user.get("scopes") or ())
