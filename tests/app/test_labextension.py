"""The JupyterLab sidebar: installed by ``pip install``, and used in a real
browser (Debian's Chromium driven by Playwright) against a live server with
simulated devices. Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_server import LiveServer
from waiting import until_sync

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.store import ModelStore

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("JUPYTER_LLM_CHROMIUM", "/usr/bin/chromium")
# Chromium on a machine with no network but loopback: no background fetches.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
GiB = 1 << 30
SIDEBAR_TAB = '.lm-TabBar-tab[data-id="jupyter-llm-sidebar"]'
TIMEOUT_MS = 60_000


def jupyter(*args: str, env: dict[str, str] | None = None) -> str:
    """A ``jupyter`` command's output, without its terminal colours."""
    result = subprocess.run(
        [sys.executable, "-m", "jupyter", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def test_pip_install_enables_the_labextension() -> None:
    out = jupyter("labextension", "list")
    assert re.search(r"jupyter-llm v\S+ enabled OK \(python, jupyter_llm\)", out), out


@pytest.mark.timeout(600)  # pip builds in an isolated environment
def test_wheel_carries_the_built_labextension_and_installs_without_node(tmp_path: Path) -> None:
    """Build a wheel with Node and npm off PATH (the assets are already built),
    install it into a new empty environment, and let JupyterLab find it there."""
    no_node = tmp_path / "bin"
    no_node.mkdir()
    for tool in ("node", "npm"):
        (no_node / tool).write_text("#!/bin/sh\necho 'no Node here' >&2\nexit 127\n")
        (no_node / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{no_node}:{os.environ['PATH']}"}
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("jupyter_llm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    share = "jupyter_llm-0.1.0.data/data/share/jupyter/labextensions/jupyter-llm/"
    assert share + "package.json" in names
    assert share + "install.json" in names
    assert any(re.fullmatch(re.escape(share) + r"static/remoteEntry\.\w+\.js", n) for n in names)
    assert not any("node_modules" in n for n in names)

    # a new, empty environment (without pip of its own: ensurepip would cost more
    # than the rest of the test); this pip installs the wheel into it and nothing
    # else, and this test's environment is left alone
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    data = venv / "share" / "jupyter"
    out = jupyter("labextension", "list", env={**env, "JUPYTER_PATH": str(data)})
    section = out.split(str(data / "labextensions"), 1)[1]
    assert re.search(r"jupyter-llm v0\.1\.0 enabled OK", section.split("\n/")[0]), out


# --- the browser -----------------------------------------------------------


@pytest.fixture(autouse=True)
def jp_asyncio_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Playwright's sync API owns this thread's current event loop in these
    tests; pytest-jupyter's fixture would close that one under Playwright."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(autouse=True)
def jp_server_cleanup() -> Iterator[None]:
    """These tests run their servers in other processes: nothing to clean up
    here, and pytest-jupyter's cleanup would need the loop Playwright holds."""
    yield


@pytest.fixture(scope="module")
def chromium() -> str:
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    pytest.skip(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def lab_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A notebook root with a model store holding a ~100 MB generated model."""
    home = tmp_path_factory.mktemp("lab")
    gguf = write_demo_model(
        home / "demo.gguf", DemoModelSpec(n_embd=512, n_layer=8, n_ff=1536, context_length=8192)
    )
    store = ModelStore(home / "models")
    store.create("demo", {"demo.gguf": store.add_blob_from_file(gguf)})
    gguf.unlink()
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    (home / "Untitled.ipynb").write_text(
        json.dumps({"cells": [], "metadata": kernel, "nbformat": 4, "nbformat_minor": 5})
    )
    return home


SIMULATED_GPU = {
    "id": "GPU-0",
    "library": "CUDA",
    "name": "Simulated RTX 2000",
    "total_memory": 2 * GiB,
    "free_memory": int(1.5 * GiB),
}


def start_lab(
    home: Path,
    name: str,
    extra: list[str] | None = None,
    gpus: list[dict] = [SIMULATED_GPU],  # noqa: B006 (never mutated)
    host_gpus: list[dict] | None = None,
    **kwargs,
) -> LiveServer:
    env = {
        **({"JUPYTER_LLM_SIMULATED_HOST_GPUS": json.dumps(host_gpus)} if host_gpus else {}),
        "JUPYTER_LLM_SIMULATED_DEVICES": json.dumps(gpus),
        "JUPYTER_LLM_SIMULATED_SYSTEM": json.dumps(
            {"total_memory": 16 * GiB, "free_memory": 11 * GiB}
        ),
    }
    state = home / f".{name}"
    # no "get notified about Jupyter news?" toast over the screenshots
    notification = state / "settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # no build check on each page load (it reads every extension's package.json,
    # about 2 s of a core in the server beside the page): the assets are built
    labconfig = state / "config" / "labconfig"
    labconfig.mkdir(parents=True, exist_ok=True)
    # window.jupyterapp, whose ``restored`` promise says when the saved layout is back
    page_config = {"buildCheck": False, "exposeAppInBrowser": True}
    (labconfig / "page_config.json").write_text(json.dumps(page_config))
    env["JUPYTER_CONFIG_PATH"] = str(state / "config")
    args = [
        f"--LabApp.workspaces_dir={state / 'workspaces'}",
        f"--LabApp.user_settings_dir={state / 'settings'}",
        *(extra or []),
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    return LiveServer(
        home / "models", home, env=env, args=args, log=ARTIFACTS / f"{name}-server.log", **kwargs
    )


@pytest.fixture(scope="module")
def lab_server(lab_home: Path) -> Iterator[LiveServer]:
    """One JupyterLab server for the sidebar and the completion tests (the same
    devices; the completion settings are in place from its start): a server
    start less on 2 cores. The tests that need their own start theirs."""
    completion_settings(lab_home / ".lab")
    server = start_lab(lab_home, "lab")
    yield server
    server.stop()


@pytest.fixture
def lab(lab_server: LiveServer, lab_home: Path) -> LiveServer:
    """The shared server as a test finds a fresh one: no model loaded, no runner,
    and no workspace saved (an earlier test's page left the sidebar open in it;
    JupyterLab reads the workspace from disk at each page load)."""
    for saved in (lab_home / ".lab" / "workspaces").glob("*"):
        saved.unlink()
    for model in lab_server.client.get("api/ps").json()["models"]:
        unloaded = lab_server.client.post(
            "api/generate", json={"model": model["name"], "keep_alive": 0}
        )
        assert unloaded.status_code == 200, unloaded.text
    until_sync(lambda: not lab_server.runners(), 30, "the runners to exit")
    return lab_server


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    yield page
    context.close()


def stop_lab(server: LiveServer, page) -> None:
    """Stop a server whose page opened a kernel: the page is taken away and
    the kernels shut down through the API first, so the server's own
    shutdown has no websocket or kernel to wait on. An idle AnyIO worker of
    jupyter_server's no longer holds its exit (``jupyter_llm.server_exit``);
    a server that outlives SIGTERM anyway is killed by LiveServer 30 s on,
    after a py-spy dump into its log."""
    with contextlib.suppress(Exception):  # a failed test's page may be gone
        page.goto("about:blank")
    with contextlib.suppress(httpx.HTTPError, ValueError):
        for kernel in server.client.get(f"{server.url}api/kernels").json():
            server.client.delete(f"{server.url}api/kernels/{kernel['id']}")
    server.stop()


def open_sidebar(page, server: LiveServer) -> object:
    """Load JupyterLab and show the LLM panel. The tab is clicked only once
    the shell has restored its saved layout, and only if that layout left the
    panel closed: a click on the current tab closes it, and a restore that
    lands after the click undoes it (CI's red run: the panel stayed hidden)."""
    page.goto(f"{server.url}lab?token={server.token}")
    tab = page.locator(SIDEBAR_TAB)
    tab.wait_for(state="visible")
    assert tab.get_attribute("title") == "LLM devices"
    page.wait_for_function("() => window.jupyterapp !== undefined")
    page.evaluate("() => window.jupyterapp.restored.then(() => true)")
    if "lm-mod-current" not in (tab.get_attribute("class") or "").split():
        tab.click()
    sidebar = page.locator("#jupyter-llm-sidebar")
    sidebar.wait_for(state="visible")
    return sidebar


@pytest.mark.timeout(300)  # JupyterLab's first page load is slow on 2 cores
def test_sidebar_shows_a_loaded_model_and_unloads_it(page, lab: LiveServer) -> None:
    server = lab
    sidebar = open_sidebar(page, server)
    gpu = sidebar.locator('.jp-LLM-device[data-device="GPU-0"]')
    ram = sidebar.locator('.jp-LLM-device[data-device="cpu"]')
    gpu.wait_for()
    ram.wait_for()
    assert "Simulated RTX 2000" in gpu.inner_text()
    assert "512 MiB / 2.0 GiB" in gpu.inner_text()
    assert "System RAM" in ram.inner_text()
    assert sidebar.locator(".jp-LLM-no-models").is_visible()
    assert not sidebar.locator(".jp-LLM-no-gpu").is_visible()
    assert sidebar.locator(".jp-LLM-badge").is_visible()  # "simulated"

    # load through the API, as a notebook or another client would
    loaded = server.client.post("api/generate", json={"model": "demo", "keep_alive": "10m"})
    assert loaded.status_code == 200, loaded.text
    row = sidebar.locator('.jp-LLM-model[data-model="demo:latest"]')
    row.wait_for()
    meta = row.locator(".jp-LLM-model-meta").inner_text()
    assert "100% GPU" in meta
    assert "ctx 4096" in meta
    countdown = row.locator(".jp-LLM-countdown").inner_text()
    assert re.search(r"unloads in (9|10):\d\d", countdown), countdown
    weights = gpu.locator(".jp-LLM-segment-weights")
    weights.wait_for()
    width = float(weights.evaluate("n => n.getBoundingClientRect().width"))
    assert width > 2, "the model's weights are visible in the GPU bar"
    assert gpu.locator(".jp-LLM-segment-kv_cache").count() == 1
    assert "demo:latest weights" in (weights.get_attribute("title") or "")
    page.screenshot(path=ARTIFACTS / "sidebar-model-loaded.png")
    sidebar.screenshot(path=ARTIFACTS / "sidebar-model-loaded-panel.png")

    row.locator(".jp-LLM-unload").click()
    row.wait_for(state="detached", timeout=20_000)
    assert server.client.get("api/ps").json()["models"] == []
    assert sidebar.locator(".jp-LLM-no-models").is_visible()
    page.wait_for_function(
        "() => !document.querySelector('[data-device=\"GPU-0\"] .jp-LLM-segment-weights')"
    )
    # /api/ps drops the model as its runner starts to exit
    until_sync(lambda: not server.runners(), 10, "the runner to exit")
    page.screenshot(path=ARTIFACTS / "sidebar-unloaded.png")

    # a hidden sidebar stands by: no requests until it is shown again
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/llm/api/ps" in r.url else None)
    page.locator(SIDEBAR_TAB).click()
    sidebar.wait_for(state="hidden")
    page.wait_for_timeout(1000)
    polls.clear()
    page.wait_for_timeout(5000)  # two and a half poll intervals
    assert polls == []
    with page.expect_request(lambda r: "/llm/api/ps" in r.url, timeout=5000):
        page.locator(SIDEBAR_TAB).click()
    sidebar.wait_for(state="visible")


@pytest.mark.timeout(300)  # JupyterLab's first page load is slow on 2 cores
def test_sidebar_says_when_the_server_extension_is_missing(page, lab_home: Path) -> None:
    config = lab_home / "no_llm_config.json"
    config.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_llm": False}}}))
    server = start_lab(lab_home, "missing", [f"--config={config}"], ready="api/status")
    try:
        assert server.client.get("api/version").status_code == 404
        sidebar = open_sidebar(page, server)
        notice = sidebar.locator(".jp-LLM-notice-warning")
        notice.wait_for()
        assert "server extension is not running" in notice.inner_text()
        assert "jupyter server extension enable jupyter_llm" in notice.inner_text()
        page.screenshot(path=ARTIFACTS / "sidebar-extension-missing.png")
    finally:
        server.stop()


KERNEL_IDLE = """() => {
    const kernel = jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel;
    return kernel?.status === "idle";
}"""


@pytest.mark.timeout(300)  # JupyterLab's first page load is slow on 2 cores
def test_sidebar_in_notebook_7_on_a_machine_without_gpu(page, lab_home: Path) -> None:
    server = start_lab(
        lab_home,
        "notebook",
        ["--JupyterNotebookApp.expose_app_in_browser=True"],
        gpus=[],
        host_gpus=[{"vendor": "nvidia", "name": "Simulated L4"}],  # an idle GPU
    )
    try:
        page.goto(f"{server.url}notebooks/Untitled.ipynb?token={server.token}")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands")
        # the shell restores its saved layout first; a panel opened before that is closed again
        page.evaluate("() => jupyterapp.restored.then(() => true)")
        assert page.evaluate("() => jupyterapp.commands.hasCommand('jupyter-llm:open-sidebar')")
        page.evaluate("() => jupyterapp.commands.execute('jupyter-llm:open-sidebar')")
        sidebar = page.locator("#jupyter-llm-sidebar")
        sidebar.wait_for(state="visible")
        sidebar.locator('.jp-LLM-device[data-device="cpu"]').wait_for()
        assert sidebar.locator(".jp-LLM-no-gpu").is_visible()
        assert sidebar.locator(".jp-LLM-device").count() == 1  # system RAM only
        # the host shows a GPU the CPU-only build cannot use: the sidebar says how to fix it
        notice = sidebar.locator(".jp-LLM-gpu-notice-idle_gpu")
        assert notice.is_visible() and "Simulated L4" in notice.inner_text()
        assert sidebar.locator(".jp-LLM-fix").inner_text() == "make lab GPU=cuda"
        page.screenshot(path=ARTIFACTS / "sidebar-notebook7-no-gpu.png")
        # the page starts the notebook's kernel; a SIGTERM while it is still
        # starting hangs the server's shutdown until LiveServer kills it (30 s)
        page.wait_for_function(KERNEL_IDLE)
    finally:
        stop_lab(server, page)


# --- inline completion -----------------------------------------------------

COMPLETION_SECTION = ".jp-LLM-completion"


def completion_settings(state: Path) -> None:
    """Small completions for the random demo model, asked at once; the inline
    completer shows its widget (our provider completes in the middle of a
    line by its own default)."""
    ours = state / "settings" / "jupyter-llm"
    ours.mkdir(parents=True, exist_ok=True)
    (ours / "completion.jupyterlab-settings").write_text(
        json.dumps({"maxTokens": 6, "debounceMs": 50})
    )
    inline = state / "settings" / "@jupyterlab" / "completer-extension"
    inline.mkdir(parents=True, exist_ok=True)
    provider = {"enabled": True, "debouncerDelay": 0, "timeout": 30_000}
    (inline / "inline-completer.jupyterlab-settings").write_text(
        json.dumps({"providers": {"jupyter-llm:inline": provider}, "showWidget": "always"})
    )


def accept_a_ghost_completion(page, editor, typed: str, shot: str, at_start: bool = False) -> str:
    """Types into an editor (at the start of its text: in the middle of a
    line), waits for a non-empty ghost completion, accepts it with Tab, and
    gives back the ghost text (now in the editor)."""
    editor.click()
    if at_start:
        page.keyboard.press("Control+Home")
    page.keyboard.type(typed)
    ghost = page.locator(".jp-GhostText")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-GhostText')]"
        ".some(g => g.textContent.trim().length > 0)",
        timeout=120_000,
    )
    # streaming ends (the indicator goes) before the text is final
    page.wait_for_function(
        "() => !document.querySelector('.jp-GhostText-streamingIndicator')", timeout=120_000
    )
    text = ghost.first.inner_text()
    page.screenshot(path=ARTIFACTS / f"completion-ghost-{shot}.png")
    shown = ghost.first.element_handle()
    page.keyboard.press("Tab")
    # this ghost goes, and its text is in the editor's own text (ghosts left
    # out): the completer asks again at once after the accepted insert, so a
    # new ghost may follow faster than a wait for no ghost at all would see
    page.wait_for_function("g => !g.isConnected", arg=shown)
    page.wait_for_function(
        """([editor, expected]) => {
            const squash = s => s.replace(/\\s/g, "");
            const lines = [...editor.querySelectorAll(".cm-line")].map(line => {
                const own = line.cloneNode(true);
                own.querySelectorAll(".jp-GhostText").forEach(g => g.remove());
                return own.textContent;
            });
            return squash(lines.join("")).includes(squash(expected));
        }""",
        arg=[editor.element_handle(), typed + text],
    )
    return text


@pytest.mark.timeout(600)  # JupyterLab's first page load and a CPU model on 2 cores
def test_inline_completion_in_a_notebook_and_a_file(page, lab_home: Path, lab: LiveServer) -> None:
    server = lab
    (lab_home / "example.py").write_text(")\n")
    # a model without fill-in-the-middle tokens: the sidebar says it cannot insert
    gguf = write_demo_model(lab_home / "nofim.gguf", DemoModelSpec(fim=False))
    store = ModelStore(lab_home / "models")
    store.create("nofim", {"nofim.gguf": store.add_blob_from_file(gguf)})
    gguf.unlink()
    sidebar = open_sidebar(page, server)
    section = sidebar.locator(COMPLETION_SECTION)
    status = section.locator(".jp-LLM-completion-status")
    page.wait_for_function(
        "() => document.querySelector('.jp-LLM-completion-status')"
        ".textContent.includes('No completion model chosen')"
    )
    section.locator("select").select_option("nofim:latest")
    page.wait_for_function(
        "() => document.querySelector('.jp-LLM-completion-status')"
        ".textContent.includes('nofim:latest cannot insert')"
    )
    sidebar.screenshot(path=ARTIFACTS / "completion-sidebar-cannot-insert.png")
    section.locator("select").select_option("demo:latest")
    page.wait_for_function(
        "() => document.querySelector('.jp-LLM-completion-status')"
        ".textContent === 'Completing with demo:latest.'"
    )
    assert (
        server.client.post("api/show", json={"model": "demo"})
        .json()["capabilities"]
        .count("insert")
    )
    sidebar.screenshot(path=ARTIFACTS / "completion-sidebar.png")
    assert "demo:latest" in status.inner_text()

    page.goto(f"{server.url}lab/tree/Untitled.ipynb?token={server.token}")
    cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.wait_for()
    ghost = accept_a_ghost_completion(page, cell, "def add(a, b):", "notebook")
    assert ghost.strip()
    assert ghost.strip() in cell.inner_text()
    page.screenshot(path=ARTIFACTS / "completion-accepted-notebook.png")

    page.goto(f"{server.url}lab/tree/example.py?token={server.token}")
    editor = page.locator(".jp-FileEditor .cm-content").first
    editor.wait_for()
    # typed before the ")": in the middle of a line, fill-in-the-middle
    ghost = accept_a_ghost_completion(page, editor, "print(", "file", at_start=True)
    assert editor.inner_text().startswith("print(" + ghost)
    assert editor.inner_text().rstrip().endswith(")")
    page.screenshot(path=ARTIFACTS / "completion-accepted-file.png")
