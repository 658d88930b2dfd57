"""The GPUs the host shows, whatever llama.cpp is built for: NVML, NVIDIA's
/proc and /dev nodes, DRM render nodes, macOS (Metal). Blocking reads: call
from an executor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jupyter_llm.devices.notices import HostGPU
from jupyter_llm.request.errors import ConfigError

HOST_ENV = "JUPYTER_LLM_SIMULATED_HOST_GPUS"  # JSON [{"vendor", "name"}], for tests
_NVIDIA_PCI_VENDOR = "0x10de"


def host_gpus(root: Path = Path("/"), platform: str = sys.platform) -> list[HostGPU]:
    if platform == "darwin":
        return [HostGPU("apple", "Apple GPU (Metal)", "macOS")]
    nvidia = _nvml_names() or _proc_nvidia(root)
    if not nvidia:
        nodes = sorted((root / "dev").glob("nvidia[0-9]*"))
        nvidia = [HostGPU("nvidia", node.name, "/dev") for node in nodes]
    others = []
    for node in sorted((root / "dev" / "dri").glob("renderD*")):
        vendor_file = root / "sys" / "class" / "drm" / node.name / "device" / "vendor"
        try:
            vendor = vendor_file.read_text().strip().lower()
        except OSError:
            vendor = ""
        if vendor == _NVIDIA_PCI_VENDOR and nvidia:
            continue  # the same NVIDIA card, seen once already
        if vendor in ("", "0x1af4", "0x1234"):
            continue  # unknown or virtual display adapters (virtio, QEMU): nothing to offload to
        kind = "nvidia" if vendor == _NVIDIA_PCI_VENDOR else "other"
        others.append(HostGPU(kind, f"{node.name} (PCI vendor {vendor})", "/dev/dri"))
    return [*nvidia, *others]


def parse_simulated_host(raw: str) -> list[HostGPU]:
    try:
        items = json.loads(raw)
        return [HostGPU(str(i["vendor"]), str(i.get("name", "GPU")), "simulated") for i in items]
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{HOST_ENV} must be a JSON list of {{vendor, name}}: {e}") from e


def _nvml_names() -> list[HostGPU]:
    from jupyter_llm.devices.nvml import _init

    if not _init():
        return []
    import pynvml

    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
    except Exception:
        return []
    return [HostGPU("nvidia", n, "nvml") for n in names]


def _proc_nvidia(root: Path) -> list[HostGPU]:
    gpus = []
    for info in sorted((root / "proc" / "driver" / "nvidia" / "gpus").glob("*/information")):
        name = "NVIDIA GPU"
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    name = line.split(":", 1)[1].strip()
        except OSError:
            pass
        gpus.append(HostGPU("nvidia", name, "/proc/driver/nvidia"))
    return gpus
