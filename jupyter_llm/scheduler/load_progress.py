"""How far each model's load has got, while its runner loads (``/api/ps``'s
``loading``, which a waiting client shows)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class LoadProgress:
    """The models loading now, each with its progress (0..1)."""

    def __init__(self) -> None:
        self._loading: dict[str, float] = {}

    def loading(self) -> dict[str, float]:
        return dict(self._loading)

    @contextlib.contextmanager
    def tracking(self, model: str) -> Iterator[Callable[[float], None]]:
        """Within this block ``model`` loads: the callback yielded takes each
        fraction its runner reports (held to 0..1); after the block it takes
        nothing."""
        self._loading[model] = 0.0
        loading = True

        def report(fraction: float) -> None:
            if loading:
                self._loading[model] = min(1.0, max(0.0, fraction))

        try:
            yield report
        finally:
            loading = False
            self._loading.pop(model, None)
