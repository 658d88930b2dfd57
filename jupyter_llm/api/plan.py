"""``POST {base_url}llm/api/plan``: what loading a model would do now, without
loading it. The body is a generate request's (``model``, ``options``; the rest
is ignored); the answer comes from the scheduler's own fit loop
(``Scheduler.plan``), shaped here as ``/api/ps`` shapes a loaded model, so the
two compare field by field."""

from __future__ import annotations

from typing import Any

from jupyter_server.base.handlers import APIHandler
from tornado import web

from jupyter_llm.api.base import LLM, LLMHandler, authorized
from jupyter_llm.api.generation import find_model, load_options
from jupyter_llm.api.requests import options_field
from jupyter_llm.devices import DeviceInfo, on_node
from jupyter_llm.memory import CPU, Allocation
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.scheduler.fit import LoadPlan


class PlanHandler(LLMHandler):
    """Reads like ``/api/show`` (``read`` on ``llm``): it loads nothing."""

    auth_resource = LLM

    @web.authenticated
    @authorized("read")
    async def post(self) -> None:
        body = await self.body_json()
        name = parse_model_name(body.get("model"))
        options = options_field(body.get("options"))
        entry = await find_model(self.llm, name)
        plan = await self.llm.scheduler.plan(entry, load_options({**entry.params, **options}))
        self.write_json(plan_body(entry.name.display, plan))


def plan_body(model: str, plan: LoadPlan) -> dict[str, Any]:
    """The plan as JSON: ``fits`` (and ``reason`` when not), ``loaded`` (it is
    already, and would be reused), ``evicts`` (model names, in the order the
    scheduler unloads them), the ``context_length`` the model gets, and its
    ``layout``: per device, its layers and bytes by kind (``/api/ps``'s
    ``allocations``, plus the device's name, library, total and free memory
    as the load would see them, after the evictions)."""
    placement = plan.placement
    size = sum(a.total for a in plan.allocations)
    return {
        "model": model,
        "fits": plan.fits,
        "reason": plan.reason,
        "loaded": plan.loaded,
        "evicts": [m.key for m in plan.evicts],
        "busy": [m.key for m in plan.evicts if m.refcount],  # the load waits for these
        "context_length": plan.wanted.num_ctx,
        "num_batch": plan.wanted.num_batch,
        "kv_cache_type": plan.wanted.kv_cache_type,
        "kv_cache_fallback": plan.wanted.kv_cache_fallback,
        "batch_invariant": plan.wanted.batch_invariant,
        "batch_invariant_fallback": plan.wanted.batch_invariant_fallback,
        "parallel": plan.parallel,
        "node": plan.node,
        "num_gpu_layers": placement.n_gpu_layers if placement else 0,
        "num_layers": placement.n_layers if placement else 0,
        "size": size,
        "size_vram": sum(a.total for a in plan.allocations if a.device != CPU),
        "layout": [
            _device_entry(plan, a, {d.id: d for d in plan.devices}) for a in plan.allocations
        ],
    }


def _device_entry(plan: LoadPlan, a: Allocation, devices: dict[str, DeviceInfo]) -> dict[str, Any]:
    device = devices.get(a.device)
    return {
        "device": on_node(plan.node, a.device),
        "name": device.name if device else a.device,
        "library": device.library if device else "",
        "layers": plan.placement.layers_on(a.device) if plan.placement else 0,
        "weights": a.weights,
        "kv_cache": a.kv_cache,
        "graph": a.graph,
        "total_memory": device.total_memory if device else 0,
        "free_memory": device.free_memory if device else 0,
    }


def handlers() -> list[tuple[str, type[APIHandler]]]:
    return [(r"api/plan", PlanHandler)]
