"""A Jupyter server whose users are a Hub's: each token is one Hub user, as
jupyterhub's identity provider makes them (``request.identity`` reads the
``hub_user`` model behind JupyterHub). Two users and an admin."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.identity import IdentityProvider, User

USERS = {
    "alice-token": {"name": "alice", "admin": False},
    "bob-token": {"name": "bob", "admin": False},
    "root-token": {"name": "root", "admin": True},
}


class HubUsers(IdentityProvider):
    async def get_user(self, handler):
        token = handler.request.headers.get("Authorization", "").partition(" ")[2]
        hub_user = USERS.get(token)
        if hub_user is None:
            return None
        user = User(hub_user["name"])
        user.hub_user = {**hub_user, "scopes": []}
        return user


def with_hub_users(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    """``jp_server_config`` with the Hub's users as its identity provider."""
    app = {**jp_server_config["ServerApp"], "identity_provider_class": HubUsers,
           "disable_check_xsrf": True}  # fmt: skip
    return {**jp_server_config, "ServerApp": app}
