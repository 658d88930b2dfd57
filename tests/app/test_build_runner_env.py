"""scripts/build-runner-env: the GPU build's pure parts (the Vulkan source patch,
the wheel cache key, toolchain messages) and the pointer a server really reads."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import platform
import shutil
import sys
from pathlib import Path

import pytest
from jupyter_server.serverapp import ServerApp

from jupyter_llm.app import LLMExtension

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-runner-env"


def load_script():
    loader = importlib.machinery.SourceFileLoader("build_runner_env", str(SCRIPT))
    spec = importlib.util.spec_from_loader("build_runner_env", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_runner_env"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


bre = load_script()

# the shape of ggml-vulkan's instance setup in llama-cpp-python 0.3.36
INSTANCE_SETUP = """\
    if (debug_utils_ext) {
        extensions.push_back("VK_EXT_debug_utils");
    }
    VkBool32 enable_best_practice = layer_settings;
    std::vector<vk::LayerSettingEXT> settings = {
        {
            "VK_LAYER_KHRONOS_validation",
            "validate_best_practices",
            vk::LayerSettingTypeEXT::eBool32,
            1,
            &enable_best_practice
        },
    };
    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);
    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, \
layers, extensions, &layer_setting_info);
#ifdef __APPLE__
"""


def test_the_layer_settings_block_is_left_out():
    patched = bre.leave_out_layer_settings(INSTANCE_SETUP)
    assert "LayerSetting" not in patched
    assert "enable_best_practice" not in patched
    assert (
        "vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, "
        "layers, extensions);\n#ifdef __APPLE__" in patched
    )
    assert patched.startswith('    if (debug_utils_ext) {\n        extensions.push_back("VK_EXT')


@pytest.mark.parametrize(
    "source",
    [
        "vk::InstanceCreateInfo instance_create_info(flags, &app_info, layers, extensions);\n",
        INSTANCE_SETUP.replace("&layer_setting_info);", "&layer_setting_info, next);"),
        INSTANCE_SETUP + INSTANCE_SETUP,
    ],
    ids=["no block", "a changed call", "two blocks"],
)
def test_an_unexpected_source_is_a_clear_error(source):
    with pytest.raises(bre.BuildError, match="not where this script expects it"):
        bre.leave_out_layer_settings(source)


def test_the_cache_key_changes_with_what_the_build_depends_on():
    base = bre.Build("vulkan", "0.3.36", "-DGGML_VULKAN=on", bre.PATCH_ID)
    others = [
        bre.Build("cuda", "0.3.36", "-DGGML_VULKAN=on", bre.PATCH_ID),
        bre.Build("vulkan", "0.3.37", "-DGGML_VULKAN=on", bre.PATCH_ID),
        bre.Build("vulkan", "0.3.36", "-DGGML_VULKAN=on -DGGML_NATIVE=off", bre.PATCH_ID),
        bre.Build("vulkan", "0.3.36", "-DGGML_VULKAN=on", ""),
    ]
    keys = {base.key, *(b.key for b in others)}
    assert len(keys) == 5
    assert base.key == bre.Build("vulkan", "0.3.36", "-DGGML_VULKAN=on", bre.PATCH_ID).key
    assert base.key.startswith("vulkan-")


def test_the_build_uses_the_version_pyproject_pins():
    text = (SCRIPT.parent.parent / "pyproject.toml").read_text()
    assert f'"llama-cpp-python=={bre.pinned_version()}"' in text


@pytest.mark.skipif(platform.system() == "Darwin", reason="Metal builds on macOS")
def test_metal_off_macos_says_so():
    with pytest.raises(bre.BuildError, match="only on macOS"):
        bre.check_toolchain("metal")


@pytest.mark.skipif(
    shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="this machine has a CUDA toolkit",
)
def test_cuda_without_nvcc_says_what_to_install(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(bre.BuildError, match="nvcc"):
        bre.check_toolchain("cuda")


def test_a_bad_backend_is_refused(capsys):
    with pytest.raises(SystemExit):
        bre.main(["rocm"])
    assert "invalid choice: 'rocm'" in capsys.readouterr().err


def linked_extension() -> LLMExtension:
    """The extension as a server links it, with the server's config paths."""
    server = ServerApp()
    server.load_config_file()
    extension = LLMExtension()
    extension._link_jupyter_server_extension(server)
    return extension


def test_the_pointer_is_what_the_server_reads(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    runner = tmp_path / "venv-vulkan" / "bin" / "python"
    # a server started from venv has venv/etc/jupyter on its config path
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(venv / "etc" / "jupyter"))
    monkeypatch.delenv("JUPYTER_LLM_PYTHON", raising=False)

    bre.point(venv, runner)
    written = json.loads((venv / bre.POINTER).read_text())
    assert written == {"LLMExtension": {"python": str(runner)}}
    assert linked_extension().build_settings().python == str(runner)

    assert bre.main(["cpu", "--point", str(venv)]) == 0
    assert not (venv / bre.POINTER).exists()
    assert linked_extension().build_settings().python == ""
