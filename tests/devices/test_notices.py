"""Idle GPUs explained: the pure decision, the host probe on a fake root, and
/api/devices with simulated host GPUs and a bad runner interpreter."""

import json
import os
import stat

import pytest

from jupyter_llm.devices.host import host_gpus
from jupyter_llm.devices.notices import HostGPU, idle_gpu_notices

NV = HostGPU("nvidia", "H200", "nvml")
AMD = HostGPU("other", "renderD128 (PCI vendor 0x1002)", "/dev/dri")
APPLE = HostGPU("apple", "Apple GPU (Metal)", "macOS")


@pytest.mark.parametrize(
    ("host", "libraries", "fixes"),
    [
        ([], {"CPU"}, []),
        ([NV], {"CPU"}, ["make lab GPU=cuda"]),
        ([NV, NV], {"CPU"}, ["make lab GPU=cuda"]),
        ([NV], {"CPU", "CUDA"}, []),
        ([NV], {"CPU", "Vulkan"}, []),  # a GPU build uses what it can
        ([AMD], {"CPU"}, ["make lab GPU=vulkan"]),
        ([NV, AMD], {"CPU"}, ["make lab GPU=cuda", "make lab GPU=vulkan"]),
        ([APPLE], {"CPU"}, ["make lab GPU=metal"]),
        ([APPLE], {"CPU", "Metal"}, []),
        ([HostGPU("weird", "x", "/dev/dri")], set(), ["make lab GPU=vulkan"]),
    ],
)
def test_idle_gpu_notices(host, libraries, fixes):
    notices = idle_gpu_notices(host, libraries)
    assert [n.fix for n in notices] == fixes
    assert all(n.kind == "idle_gpu" and "CPU" in n.message for n in notices)


def test_notice_names_the_gpus_and_count():
    (notice,) = idle_gpu_notices([NV, HostGPU("nvidia", "L4", "nvml")], {"CPU"})
    assert "2 GPU(s)" in notice.message and "H200" in notice.message and "L4" in notice.message


def _write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_host_probe_reads_proc_dev_and_drm(tmp_path):
    assert host_gpus(tmp_path, platform="linux") == []
    _write(tmp_path / "proc/driver/nvidia/gpus/0000:01:00.0/information", "Model: \t NVIDIA L4\n")
    _write(tmp_path / "dev/dri/renderD128")
    _write(tmp_path / "sys/class/drm/renderD128/device/vendor", "0x10de\n")  # the same card
    _write(tmp_path / "dev/dri/renderD129")
    _write(tmp_path / "sys/class/drm/renderD129/device/vendor", "0x1002\n")
    _write(tmp_path / "dev/dri/renderD130")
    _write(tmp_path / "sys/class/drm/renderD130/device/vendor", "0x1af4\n")  # virtio
    gpus = host_gpus(tmp_path, platform="linux")
    assert [(g.vendor, g.source) for g in gpus] == [
        ("nvidia", "/proc/driver/nvidia"),
        ("other", "/dev/dri"),
    ]
    assert gpus[0].name == "NVIDIA L4"


def test_host_probe_dev_nodes_without_proc(tmp_path):
    _write(tmp_path / "dev/nvidia0")
    _write(tmp_path / "dev/nvidiactl")
    assert [g.name for g in host_gpus(tmp_path, platform="linux")] == ["nvidia0"]
    assert host_gpus(tmp_path, platform="darwin")[0].vendor == "apple"


class TestIdleGpuOnApi:
    @pytest.fixture(autouse=True)
    def host(self, monkeypatch):
        monkeypatch.setenv(
            "JUPYTER_LLM_SIMULATED_HOST_GPUS", '[{"vendor": "nvidia", "name": "L4"}]'
        )

    @pytest.fixture
    def simulated_devices(self):
        return [{"id": "cpu", "library": "CPU", "name": "CPU", "total_memory": 8, "free_memory": 8}]

    async def test_devices_carry_the_notice(self, jp_fetch):
        data = json.loads((await jp_fetch("llm", "api", "devices")).body)
        (notice,) = data["notices"]
        assert notice["kind"] == "idle_gpu" and notice["fix"] == "make lab GPU=cuda"
        assert "L4" in notice["message"]


def _script(path, body):
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("case", ["missing", "not_executable", "no_llama_cpp"])
async def test_bad_runner_interpreter_is_a_notice_not_a_crash(tmp_path, case):
    from jupyter_llm.config import Settings
    from jupyter_llm.services import build_services

    if case == "missing":
        python = str(tmp_path / "no-such-python")
        expect = "no-such-python"
    elif case == "not_executable":
        python = str(tmp_path / "python")
        (tmp_path / "python").write_text("")
        expect = "ermission"
    else:  # an interpreter that has no llama_cpp: a python that hides it
        python = _script(
            tmp_path / "python",
            "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'llama_cpp'\" >&2\nexit 1\n",
        )
        expect = "llama_cpp"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_LLM_SIMULATED")}
    settings = Settings.from_env(env, models_dir=str(tmp_path / "models"), python=python)
    services = build_services(settings)
    devices = await services.devices.devices()
    assert [d.id for d in devices] == ["cpu"]
    notices = await services.devices.notices(devices)
    failed = [n for n in notices if n.kind == "runner_failed"]
    assert failed and expect in failed[0].message and python in failed[0].message
