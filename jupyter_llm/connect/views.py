"""What ``list``, ``ps`` and ``show`` print, as pure functions of the API's
JSON, shared by ``jupyter llm`` and the ``%llm`` line commands. Every value
passes through ``terminal_text``: names, system prompts and licenses come
from registries and may carry escape sequences."""

from __future__ import annotations

from typing import Any

from jupyter_llm.connect.labels import ago, human_size, processor_label, until
from jupyter_llm.connect.terminal import terminal_text


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned columns three spaces apart, like Ollama's tables."""
    rows = [[terminal_text(str(c)) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    )


def models_table(models: list[dict[str, Any]]) -> str:
    """``/api/tags`` models."""
    rows = [
        [m["name"], m["digest"][:12], human_size(m["size"]), ago(m["modified_at"])] for m in models
    ]
    return table(rows, ["NAME", "ID", "SIZE", "MODIFIED"])


def loaded_table(models: list[dict[str, Any]]) -> str:
    """``/api/ps`` models; a USERS column when a shared engine names who holds
    them (a plain server's one user, ``local``, is not shown)."""
    rows = [
        [
            m["name"],
            m["digest"][:12],
            human_size(m["size"]),
            processor_label(m),
            str(m.get("context_length", "")),
            until(m.get("expires_at", "")),
        ]
        for m in models
    ]
    holders = [[u["name"] for u in m.get("users") or []] for m in models]
    if not any(set(names) - {"local"} for names in holders):
        return table(rows, ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"])
    rows = [[*row, ", ".join(names)] for row, names in zip(rows, holders, strict=True)]
    return table(rows, ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "USERS"])


def model_details(info: dict[str, Any]) -> str:
    """``/api/show``: the model's shape, capabilities, parameters, system prompt
    and the first line of its license."""
    d, mi = info["details"], info["model_info"]
    arch = mi.get("general.architecture", d.get("family", ""))
    lines = ["  Model"]
    for label, value in (
        ("architecture", arch),
        ("parameters", d.get("parameter_size")),
        ("context length", mi.get(f"{arch}.context_length")),
        ("embedding length", mi.get(f"{arch}.embedding_length")),
        ("quantization", d.get("quantization_level")),
    ):
        lines.append(f"    {label:<20}{value}")
    lines.append("\n  Capabilities")
    lines.extend(f"    {capability}" for capability in info.get("capabilities", []))
    if info.get("parameters"):
        lines.append("\n  Parameters")
        lines.extend(f"    {line}" for line in info["parameters"].splitlines())
    if info.get("system"):
        lines.append("\n  System\n    " + info["system"].strip().replace("\n", "\n    "))
    if info.get("license"):
        lines.append("\n  License\n    " + info["license"].strip().splitlines()[0])
    return terminal_text("\n".join(str(line) for line in lines))


def plan_request(model: str, num_ctx: int | None, num_gpu: int | None) -> dict[str, Any]:
    """The ``/api/plan`` body of ``jupyter llm plan`` and ``%llm plan``."""
    options = {k: v for k, v in (("num_ctx", num_ctx), ("num_gpu", num_gpu)) if v is not None}
    return {"model": model, "options": options}


def plan_text(plan: dict[str, Any]) -> str:
    """``/api/plan``: whether the model fits, what it evicts, and per device
    its layers and bytes by kind (the sizes as ``ps`` shows them)."""
    model = plan["model"]
    if not plan["fits"]:
        head = f"{model} does not fit: {plan['reason']}"
    elif plan["loaded"]:
        head = f"{model} is loaded as asked: a request uses it as it is"
    else:
        head = f"{model} fits: {plan['num_gpu_layers']}/{plan['num_layers']} layers on GPUs"
    lines = [head]
    if plan["fits"]:
        lines.append(f"context {plan['context_length']}, {plan['parallel']} parallel")
    if plan["evicts"]:
        busy = set(plan.get("busy") or [])
        names = [f"{n} (after its requests end)" if n in busy else n for n in plan["evicts"]]
        lines.append("evicts " + ", ".join(names))
    rows = [
        [e["device"], e["name"], e["library"], str(e["layers"]), human_size(e["weights"]),
         human_size(e["kv_cache"]), human_size(e["graph"]), human_size(e["free_memory"])]
        for e in plan["layout"]
    ]  # fmt: skip
    if rows:
        header = ["DEVICE", "NAME", "LIBRARY", "LAYERS", "WEIGHTS", "KV CACHE", "GRAPH", "FREE"]
        lines.append(table(rows, header))
    return terminal_text("\n".join(lines))
