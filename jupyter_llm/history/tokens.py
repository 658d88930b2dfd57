"""Tokens generated so far, per model, counted as they stream (not at the
end of a completion), so the history's tokens/s moves while a model writes."""

from __future__ import annotations

from collections import OrderedDict

from jupyter_llm.request.limits import HISTORY_MODELS


class TokenTally:
    """Running totals per model, at most ``cap`` models: the model that
    generated least recently is forgotten for a new one. A fixed set of the
    first models seen would turn every later model into ``other`` for the
    server's life (models come and go; a user may copy a model under new
    names). A forgotten model's rate between two samples is left out
    (``rates`` skips totals that went down or vanished)."""

    def __init__(self, cap: int = HISTORY_MODELS.value * 4) -> None:
        self._totals: OrderedDict[str, int] = OrderedDict()
        self._cap = cap

    def add(self, model: str, count: int = 1) -> None:
        self._totals[model] = self._totals.pop(model, 0) + count
        while len(self._totals) > self._cap:
            self._totals.popitem(last=False)

    def totals(self) -> dict[str, int]:
        return dict(self._totals)


TOKENS = TokenTally()  # the server's one tally, fed by ``metrics.Completion.saw``


def rates(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    """Tokens per second of each model between two tallies (models with none left out)."""
    if seconds <= 0:
        return {}
    out = {}
    for model, total in after.items():
        made = total - before.get(model, 0)
        if made > 0:
            out[model] = round(made / seconds, 2)
    return out
