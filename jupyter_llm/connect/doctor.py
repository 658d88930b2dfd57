"""``jupyter llm doctor``: what the server's runner interpreter and llama.cpp
build can use, against the GPUs the host shows. Pure: from /api/devices."""

from __future__ import annotations

from typing import Any

from jupyter_llm.connect.views import table


def doctor_report(devices: dict[str, Any]) -> tuple[str, bool]:
    """The report's text, and whether all is well (no notices)."""
    runner = devices.get("runner", {})
    ggml = devices.get("devices", [])
    backends = sorted({str(d.get("library", "")) for d in ggml})
    lines = [
        f"runner interpreter: {runner.get('python', '?')}",
        f"llama.cpp backends with devices: {', '.join(backends) or 'none'}",
        "",
        "devices llama.cpp sees (ggml):",
        table(
            [
                [str(d.get("id", "")), str(d.get("library", "")), str(d.get("name", ""))]
                for d in ggml
            ],
            ["ID", "BACKEND", "NAME"],
        ),
        "",
        "GPUs the host shows (NVML, device nodes, OS):",
    ]
    host = devices.get("host_gpus", [])
    if host:
        lines.append(
            table(
                [
                    [str(g.get("vendor", "")), str(g.get("name", "")), str(g.get("source", ""))]
                    for g in host
                ],
                ["VENDOR", "NAME", "SEEN IN"],
            )
        )
    else:
        lines.append("none")
    if devices.get("simulated"):
        lines.append("(devices are simulated: JUPYTER_LLM_SIMULATED_DEVICES)")
    notices = devices.get("notices", [])
    lines.append("")
    if not notices:
        lines.append("OK: nothing to fix.")
    for n in notices:
        lines.append(f"PROBLEM: {n.get('message', '')}")
        lines.append(f"  fix: {n.get('fix', '')}")
    return "\n".join(lines), not notices
