"""Who may use the engine behind JupyterHub, as jupyter_server's two hooks.

``HubIdentityProvider`` asks the Hub who a token belongs to (``Authorization:
token ...``: a user's server's ``$JUPYTERHUB_API_TOKEN``, any OAuth token the
Hub issued), through ``jupyterhub.services.auth.HubAuth``, and lets in only
those holding the service's access scope (``access:services!service=<name>``,
which HubAuth reads from the environment the Hub gives its services). Browsers
talk to their own server, which forwards (``api.forward``): no cookie, so no
OAuth login flow, is needed here. The
user it returns carries the Hub's user model as ``hub_user``, which
``identity.requester_of`` turns into the requester the scheduler shares the
model slots by. ``HubAuthorizer`` then allows an identified user everything
(the access scope is checked again, to be safe): the one rule with a
different answer per user, who may cut off other users' requests by
unloading their model, is the scheduler's (a Hub admin, or ``admin:services``).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth import Authorizer, IdentityProvider, User
from jupyterhub.services.auth import HubAuth
from tornado import web
from traitlets import Instance, default

from jupyter_llm.api.base import LLMHandler


class HubUser(User):
    """A jupyter_server user with the Hub's model (name, kind, scopes, ...)."""

    hub_user: dict[str, Any]

    def __init__(self, hub_user: dict[str, Any]) -> None:
        self.hub_user = hub_user
        super().__init__(username=str(hub_user["name"]))


class HubIdentityProvider(IdentityProvider):
    hub_auth = Instance(HubAuth)

    @default("hub_auth")
    def _default_hub_auth(self) -> HubAuth:
        return HubAuth(parent=self)  # configured by the Hub's JUPYTERHUB_* variables

    async def get_user(self, handler: web.RequestHandler) -> User | None:  # type: ignore[override]
        if hasattr(handler, "_llm_hub_user"):
            return handler._llm_hub_user
        model = await self.hub_auth.get_user(handler, sync=False)
        user = None
        if model:
            if not self.hub_auth.check_scopes(self.hub_auth.access_scopes, model):
                handler._llm_hub_user = None
                needs = " or ".join(sorted(self.hub_auth.access_scopes))
                raise web.HTTPError(
                    403,
                    f"{model.get('kind', 'user')} {model['name']} may not use this service: "
                    f"its token lacks the scope {needs}",
                )
            user = HubUser(model)
        elif isinstance(handler, LLMHandler):  # every route but the heartbeat
            handler._llm_hub_user = None
            raise web.HTTPError(
                403,
                "a JupyterHub token is required (Authorization: token ...), one holding "
                + " or ".join(sorted(self.hub_auth.access_scopes)),
            )
        handler._llm_hub_user = user
        return user

    def is_token_authenticated(self, handler: web.RequestHandler) -> bool:
        return bool(getattr(handler, "_token_authenticated", False))

    def validate_security(self, app: Any, ssl_options: Any = None) -> None:
        return  # the Hub does the authenticating


class HubAuthorizer(Authorizer):
    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        hub_auth = handler.identity_provider.hub_auth
        return isinstance(user, HubUser) and bool(
            hub_auth.check_scopes(hub_auth.access_scopes, user.hub_user)
        )
