"""``DeviceDashboard``: every device and system RAM as a stacked memory bar (per
loaded model: weights, KV cache, graph; then other use and free), and the
loaded models with an expiry countdown and an Unload button.

A background thread refreshes it; that thread only sets widget values (no
output), never blocks the kernel, and stops when the widget is closed. Every
string from the server is escaped before it goes into an HTML widget: model
names and device names come from registries and drivers, not from us.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import ipywidgets as w

from jupyter_llm.connect import LLMClientError, ServerEndpoint
from jupyter_llm.connect.labels import processor_label, threads_label

PALETTE = ["#1e88e5", "#8e24aa", "#43a047", "#f4511e", "#00897b", "#6d4c41"]
SHADES = {"weights": 1.0, "kv_cache": 0.7, "graph": 0.45}


@dataclass(frozen=True)
class Segment:
    label: str
    kind: str  # weights, kv_cache, graph, other, free
    size: int
    color: str


def memory_segments(
    device: str, total: int, free: int, models: list[dict[str, Any]]
) -> list[Segment]:
    """Pure: how ``device``'s memory splits between our models, other use and free."""
    segments = []
    ours = 0
    for i, model in enumerate(models):
        for a in model.get("allocations", []):
            if a.get("device") != device:
                continue
            for kind in ("weights", "kv_cache", "graph"):
                if a.get(kind):
                    segments.append(
                        Segment(
                            f"{model['name']} {kind.replace('_', ' ')}",
                            kind,
                            int(a[kind]),
                            _shade(PALETTE[i % len(PALETTE)], SHADES[kind]),
                        )
                    )
                    ours += int(a[kind])
    other = max(0, total - free - ours)
    if other:
        segments.append(Segment("other use", "other", other, "#9e9e9e"))
    segments.append(Segment("free", "free", max(0, total - other - ours), "#e0e0e0"))
    return segments


def bar_html(segments: list[Segment], total: int) -> str:
    total = max(total, sum(s.size for s in segments), 1)
    spans = "".join(
        f'<div title="{html.escape(s.label)}: {_gib(s.size)}" '
        f'style="width:{100 * s.size / total:.3f}%;background:{s.color};height:100%"></div>'
        for s in segments
        if s.size
    )
    return (
        f'<div style="display:flex;width:100%;height:14px;border-radius:3px;'
        f'overflow:hidden;border:1px solid #bdbdbd">{spans}</div>'
    )


def countdown(expires_at: str, now: datetime | None = None) -> str:
    if not isinstance(expires_at, str):
        return ""
    try:
        then = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return ""
    seconds = (then - (now or datetime.now(UTC))).total_seconds()
    if seconds > 10 * 365 * 86400:
        return "kept loaded"
    if seconds <= 0:
        return "unloading"
    minutes, secs = divmod(int(seconds), 60)
    return f"unloads in {minutes}:{secs:02d}"


class DeviceDashboard(w.VBox):
    def __init__(self, endpoint: ServerEndpoint, interval: float = 2.0, start: bool = True) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.interval = interval
        self.title = w.HTML("<b>Devices</b>")
        self.notices = w.HTML("")
        self.device_rows = w.VBox()
        self.model_rows = w.VBox()
        self.status = w.HTML("")
        self.children = [
            self.title,
            self.notices,
            self.device_rows,
            w.HTML("<b>Loaded models</b>"),
            self.model_rows,
            self.status,
        ]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.refresh()
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name="jupyter-llm-dashboard"
            )
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        super().close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def refresh(self) -> None:
        """Fetch /api/devices and /api/ps and set the widgets' values."""
        try:
            devices = self.endpoint.request("GET", "api/devices")
            models = self.endpoint.request("GET", "api/ps")["models"]
        except LLMClientError as e:
            self.status.value = f'<span style="color:#c62828">{html.escape(str(e))}</span>'
            return
        self.status.value = ""
        self.notices.value = notices_html(devices.get("notices", []))
        rows = []
        for d in devices["devices"]:
            if d["library"] == "CPU":
                continue
            marker = " (integrated)" if d.get("integrated") else ""
            rows.append(
                self._device_row(
                    f"{d['name']} · {d['library']}{marker}",
                    d["id"],
                    d["total_memory"],
                    d["free_memory"],
                    models,
                )
            )
        system = devices["system"]
        rows.append(
            self._device_row(
                "System RAM", "cpu", system["total_memory"], system["free_memory"], models
            )
        )
        if len(rows) == 1:
            rows.insert(0, w.HTML("<i>No GPU found: models run on the CPU.</i>"))
        self.device_rows.children = rows
        self.model_rows.children = [self._model_row(m) for m in models] or [
            w.HTML("<i>No model is loaded.</i>")
        ]

    def _device_row(
        self, label: str, device: str, total: int, free: int, models: list[dict[str, Any]]
    ) -> w.Widget:
        segments = memory_segments(device, total, free, models)
        used = total - free
        return w.HTML(
            f"<div><span>{html.escape(label)}</span> <span style='color:#616161'>"
            f"{_gib(used)} / {_gib(total)}</span>{bar_html(segments, total)}</div>"
        )

    def _model_row(self, model: dict[str, Any]) -> w.Widget:
        name = model["name"]
        parts = [
            f"<b>{html.escape(str(name))}</b> {_gib(model['size'])}",
            html.escape(processor_label(model)),
            f"ctx {html.escape(str(model.get('context_length', '')))}",
            html.escape(threads_label(model)),
            html.escape(countdown(model.get("expires_at", ""))),
        ]
        info = w.HTML(" · ".join(p for p in parts if p))
        button = w.Button(
            description="Unload", button_style="warning", layout=w.Layout(width="90px")
        )
        button.on_click(lambda _: self.unload(name))
        return w.HBox([button, info])

    def unload(self, name: str) -> None:
        try:
            self.endpoint.request("POST", "api/generate", {"model": name, "keep_alive": 0})
        except LLMClientError as e:
            self.status.value = f'<span style="color:#c62828">{html.escape(str(e))}</span>'
        self.refresh()


def notices_html(notices: list[dict[str, Any]]) -> str:
    """Pure: each notice (an idle GPU, a failed runner interpreter) and its fix."""
    return "".join(
        f'<div style="color:#e65100">&#9888; {html.escape(str(n.get("message", "")))}'
        f"<br>Fix: <code>{html.escape(str(n.get('fix', '')))}</code></div>"
        for n in notices
    )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.1f} MiB"


def _shade(color: str, amount: float) -> str:
    """Lighter versions of a model's colour for its KV cache and graph."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    mix = [round(c * amount + 255 * (1 - amount)) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)
