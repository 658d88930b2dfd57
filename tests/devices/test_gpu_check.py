"""benchmarks/gpu_check.py: the parts that need no GPU (comparison, table,
the no-GPU refusal), and its --dry-run flow on this CPU build."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_llm.devices.notices import HostGPU

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
spec.loader.exec_module(gpu_check)
MiB = 1 << 20


def alloc(device, weights, kv, graph):
    return {"device": device, "weights": weights, "kv_cache": kv, "graph": graph}


def test_compare_per_device_and_kind_with_totals():
    rows = gpu_check.compare(
        "m",
        [alloc("GPU-0", 110, 50, 20), alloc("cpu", 10, 0, 5)],
        [alloc("GPU-0", 100, 50, 25), alloc("cpu", 10, 0, 5), alloc("CUDA1", 1, 0, 0)],
    )
    by = {(r.device, r.kind): r for r in rows}
    assert by[("GPU-0", "weights")].error == pytest.approx(0.10)
    assert by[("GPU-0", "graph")].error == pytest.approx(-0.2)
    assert by[("GPU-0", "total")].estimated == 180 and by[("GPU-0", "total")].measured == 175
    assert by[("cpu", "kv_cache")].error == 0.0  # both zero
    assert by[("CUDA1", "total")].estimated == 0  # measured where we planned nothing
    assert [r.device for r in rows if r.kind == "total"] == ["GPU-0", "cpu", "CUDA1"]


@pytest.mark.parametrize(
    ("est", "got", "worst"),
    [
        ([alloc("g", 100, 0, 0)], [alloc("g", 100, 0, 0)], 0.0),
        ([alloc("g", 120, 0, 0)], [alloc("g", 100, 0, 0)], 0.2),
        ([alloc("g", 90, 0, 0), alloc("cpu", 5, 0, 0)], [alloc("g", 100, 0, 0)], 0.1),
        ([], [], 0.0),
    ],
)
def test_worst_total_error(est, got, worst):
    assert gpu_check.worst_total_error(gpu_check.compare("c", est, got)) == pytest.approx(worst)


def test_table_has_a_row_per_comparison_and_says_na():
    rows = gpu_check.compare("gemma3 ngl=19", [alloc("GPU-0", 2 * MiB, 0, 0)], [])
    text = gpu_check.table(rows)
    assert text.splitlines()[0].split()[:3] == ["case", "device", "kind"]
    assert len(text.splitlines()) == 1 + len(rows)
    assert "n/a" in text and "2.0" in text


def test_no_gpu_message():
    assert gpu_check.no_gpu_message([HostGPU("nvidia", "H200", "nvml")]) is None
    assert "--dry-run" in gpu_check.no_gpu_message([])
    assert gpu_check.no_gpu_message([HostGPU("other", "Radeon", "/dev/dri")]) is not None


def test_refuses_clearly_without_a_gpu():
    if gpu_check.no_gpu_message(gpu_check_host()) is None:
        pytest.skip("this machine has an NVIDIA GPU")
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "no NVIDIA GPU is visible" in done.stderr


def gpu_check_host():
    from jupyter_llm.devices.host import host_gpus

    return host_gpus()


@pytest.mark.timeout(600)
def test_dry_run_runs_the_whole_flow_on_the_cpu_build():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--test-size", "--tolerance", "100"],
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = done.stdout
    assert "FAIL " not in out, out + done.stderr
    for step in ("discovery", "placement: small", "partial offload: gqa", "eviction"):
        assert step in out
    assert "case" in out and "kv_cache" in out and "all checks passed" in out
    assert done.returncode == 0
