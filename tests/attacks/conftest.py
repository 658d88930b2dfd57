"""The attack suite's fixtures; its helpers are in ``harness`` (imported by
name: ``from harness import slowdown``)."""

from harness import users

__all__ = ["users"]
