"""One error type per failure a user can see; the API maps each to its HTTP status."""

from __future__ import annotations


class LLMError(Exception):
    """Base class: ``str(e)`` is the message a client sees."""

    status = 500


class InvalidRequest(LLMError):
    status = 400


class ModelNotFound(LLMError):
    status = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"model '{name}' not found")
        self.name = name


class ServerBusy(LLMError):
    status = 503

    def __init__(self) -> None:
        super().__init__("server busy, please try again. maximum pending requests exceeded")


class RunnerFailed(LLMError):
    """A runner process failed or died; the message names the cause."""

    status = 500


class ModelLoadFailed(RunnerFailed):
    pass


class AllocationFailed(ModelLoadFailed):
    """llama.cpp could not allocate the memory a load asked for (classified by
    the runner from llama.cpp's own log; the scheduler may retry smaller)."""


class ModelUnloaded(RunnerFailed):
    """An administrator unloaded the model while this request ran on it (the
    scheduler closes the runner with this as the reason, so the requests it
    cuts off end with it rather than with the runner's exit status)."""

    status = 503  # the next request loads the model again

    def __init__(self, name: str) -> None:
        super().__init__(f"model '{name}' was unloaded by an administrator while this request ran")
        self.name = name


class NodeLost(RunnerFailed):
    """The cluster node (or the Ray actor) serving a model went away: its
    requests fail with this, and the next request loads the model elsewhere."""

    status = 503


class InsufficientMemory(LLMError):
    """No layout fits the memory that is free, even with nothing else loaded."""

    status = 500


class InsufficientStorage(LLMError):
    """Not enough disk space for a pull."""

    status = 507


class PullFailed(LLMError):
    """The remote side of a pull failed (missing, wrong digest, dropped)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class ConfigError(LLMError):
    status = 500


class EngineUnreachable(LLMError):
    """A user's server forwards to a shared engine (``api.forward``) that does not answer."""

    status = 502
