"""Tokens generated so far, per model, counted as they stream (not at the
end of a completion), so the history's tokens/s moves while a model writes."""

from __future__ import annotations

from jupyter_llm.request.limits import HISTORY_MODELS

OTHER = "other"


class TokenTally:
    """Running totals per model; models past the cap are counted as ``other``
    (the store bounds models, this bounds what one process keeps)."""

    def __init__(self, cap: int = HISTORY_MODELS.value * 4) -> None:
        self._totals: dict[str, int] = {}
        self._cap = cap

    def add(self, model: str, count: int = 1) -> None:
        if model not in self._totals and len(self._totals) >= self._cap:
            model = OTHER
        self._totals[model] = self._totals.get(model, 0) + count

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
