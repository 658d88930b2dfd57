"""Every route the app mounts, read from the app itself, so that a table
built from it cannot forget a new route."""

import re

from jupyter_llm.api import NotFoundHandler, handlers
from jupyter_llm.api.ollama import RootHandler

METHODS = ("get", "head", "post", "put", "delete", "patch")
PUBLIC = {RootHandler}  # the only handlers without a token
# The catch-all 404 is no route of its own but every path the others leave:
# it has no methods (it answers in ``prepare``), no (action, resource) and no
# body, so the tables built from ``routes()`` leave it out. Its token refusal
# is tested below, its 404s in test_unknown_routes.py, and that it asks the
# Authorizer nothing in test_authorization.py.
CATCH_ALL = {NotFoundHandler}


def routes(public: bool = False):
    """(path, METHOD) of every route, the authenticated ones or the public ones."""
    out = []
    for pattern, handler in handlers():
        if handler in CATCH_ALL or (handler in PUBLIC) != public:
            continue
        path = "" if pattern == "?" else pattern
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", "sha256:" + "0" * 64, path)
        for method in METHODS:
            if method in handler.__dict__ or any(
                method in base.__dict__
                for base in handler.__mro__[1:]
                if "jupyter_llm" in base.__module__
            ):
                out.append((path, method.upper()))
    return out
