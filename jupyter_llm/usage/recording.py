"""The edge between a running request and the usage table: ``api.generation``
opens a ``Held`` when the scheduler grants a slot and closes it however the
request ends (finished, cancelled, failed), so device-seconds count every
second a slot was held."""

from __future__ import annotations

import time
from typing import Any

from jupyter_llm.request.origin import ORIGIN
from jupyter_llm.usage.accounting import Sample
from jupyter_llm.usage.store import UsageStore


class Held:
    """One request's hold on a slot, counted into ``store`` when it ends."""

    def __init__(
        self, store: UsageStore | None, user: str, model: str, lease: Any, started_ns: int
    ) -> None:
        self.store, self.user, self.model = store, user, model
        self.origin = ORIGIN.get()  # read now: the handler's context
        held_on = getattr(getattr(lease, "loaded", None), "allocations", ())
        self.devices = len({a.device for a in held_on if a.total}) or 1
        self.started = started_ns / 1e9  # the request's start (perf_counter)
        self.held_from = time.perf_counter()
        self.prompt = self.generated = 0
        self.decode_s = 0.0

    def done(self, prompt_tokens: int, generated_tokens: int, eval_ns: int) -> None:
        """The runner's figures for the whole request."""
        self.prompt, self.generated, self.decode_s = prompt_tokens, generated_tokens, eval_ns / 1e9

    def close(self, first_token: float | None = None) -> None:
        """Count the request (``first_token``: the perf_counter time it came)."""
        if self.store is None:
            return
        sample = Sample(
            model=self.model,
            prompt_tokens=self.prompt,
            generated_tokens=self.generated,
            first_token_s=None if first_token is None else first_token - self.started,
            decode_s=self.decode_s,
            held_s=time.perf_counter() - self.held_from,
            devices=self.devices,
        )
        self.store.record(self.user, self.origin, sample)
