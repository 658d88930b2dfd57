"""Enumerate ggml backend devices through the ``ggml_backend_dev_*`` functions of
the libraries llama-cpp-python ships (ctypes). Runs inside a runner process, so
a backend that crashes takes down only that runner."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

# enum ggml_backend_dev_type
TYPE_NAMES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


class _DevProps(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("description", ctypes.c_char_p),
        ("memory_free", ctypes.c_size_t),
        ("memory_total", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("device_id", ctypes.c_char_p),
        ("caps", ctypes.c_bool * 16),  # ggml_backend_dev_caps, with room to grow
    ]


def _load_ggml() -> ctypes.CDLL:
    import llama_cpp  # loads libllama and, with it, the ggml libraries

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    suffix = {"darwin": "dylib", "win32": "dll"}.get(sys.platform, "so")
    for name in (f"libggml.{suffix}", f"ggml.{suffix}", f"libllama.{suffix}"):
        path = lib_dir / name
        if path.exists():
            lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            if hasattr(lib, "ggml_backend_dev_count"):
                return lib
    raise OSError(f"no ggml library with ggml_backend_dev_count in {lib_dir}")


def list_ggml_devices() -> list[dict[str, Any]]:
    """Raw device facts: name, description, type, library, memory, PCI id."""
    lib = _load_ggml()
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.ggml_backend_dev_count.restype = sz
    lib.ggml_backend_dev_get.argtypes, lib.ggml_backend_dev_get.restype = [sz], vp
    lib.ggml_backend_dev_get_props.argtypes = [vp, ctypes.POINTER(_DevProps)]
    lib.ggml_backend_dev_get_props.restype = None
    lib.ggml_backend_dev_backend_reg.argtypes, lib.ggml_backend_dev_backend_reg.restype = [vp], vp
    lib.ggml_backend_reg_name.argtypes, lib.ggml_backend_reg_name.restype = [vp], cp
    if hasattr(lib, "ggml_backend_load_all"):
        lib.ggml_backend_load_all.restype = None
        lib.ggml_backend_load_all()  # dynamic backends, when the build has them

    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        props = _DevProps()
        lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
        kind = TYPE_NAMES.get(props.type, "unknown")
        if kind in ("accel", "meta"):
            continue  # helpers of the CPU backend, not places to put layers
        reg = lib.ggml_backend_dev_backend_reg(dev)
        library = (lib.ggml_backend_reg_name(reg) or b"").decode() if reg else ""
        devices.append(
            {
                "index": i,
                "name": (props.name or b"").decode(errors="replace"),
                "description": (props.description or b"").decode(errors="replace"),
                "type": kind,
                "library": library or ("CPU" if kind == "cpu" else "unknown"),
                "free_memory": int(props.memory_free),
                "total_memory": int(props.memory_total),
                "pci_id": (props.device_id or b"").decode(errors="replace"),
            }
        )
    return devices
