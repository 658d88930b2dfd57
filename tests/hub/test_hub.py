"""One engine for every user of a real JupyterHub (issue 16).

A Hub (DummyAuthenticator, SimpleLocalProcessSpawner, npm's
configurable-http-proxy) runs the engine as a managed service (``jupyter llm
serve``) and two users' servers pointed at it (``JUPYTER_LLM_ENGINE_URL``).
Two users' kernels stream from the one engine at once (alice with ``%%llm``,
stopped by the kernel's interrupt, bob with ``jupyter_llm.client()``, which
leaves mid-stream); the engine's ``/api/ps`` shows both; bob's unload waits
for alice's request; the engine's /metrics counts each user's requests under
their name; a request (or a scrape) without a token, or with one lacking the
service's scope, is refused; every runner is the engine's; SIGTERM and the
Hub's stop leave no runner behind.

The proxy comes from ``tests/hub`` (``npm ci`` there, as ``make test`` does).
Without it, or without ``jupyterhub``, the test is skipped, and under CI
(``CI`` set) it fails instead.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from waiting import iopub_until, until_sync

from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.hub.service import Where, where
from jupyter_llm.models.store import ModelStore
from jupyter_llm.request.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CHP = REPO / "tests" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
REQUIRED = bool(os.environ.get("CI"))
BIN = Path(sys.executable).parent
LONG_CTX = 1 << 16  # a greedy generation of the demo model cannot end before it is stopped
USERS = ("alice", "bob")
# the Hub and its servers refuse connections while they start
wait_until = partial(until_sync, poll=0.05, ignore=(httpx.TransportError,))


def require(ok: bool, reason: str) -> None:
    if ok:
        return
    if REQUIRED:
        pytest.fail(f"the JupyterHub test must run under CI, but {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {proxy_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.pid_file = {proxy_pid!r}
c.JupyterHub.db_url = "sqlite:///{tmp}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {users!r}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{tmp}/home/{{username}}"
c.Spawner.args = ["--allow-root"]
c.Spawner.http_timeout = 90
c.Spawner.start_timeout = 90
# a spawn request answers 202 at once (not after up to 10 s of waiting for the server),
# so both users' servers start together, as start_servers asks
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}

# the Hub notices its service exited (and restarts it) when it polls the process:
# every 30 s, not configurable (services' spawners get no config); every second here,
# so the test's SIGTERM of the engine is not followed by up to 33 s of waiting
from jupyterhub.services.service import _ServiceSpawner  # noqa: E402

_start_polling = _ServiceSpawner.start_polling


def _poll_every_second(self):
    self.poll_interval = 1
    return _start_polling(self)


_ServiceSpawner.start_polling = _poll_every_second

# -- what the README's "Sharing and scaling" says a Hub needs -------------------------
c.JupyterHub.services = [
    {{
        "name": "llm",
        "url": "http://127.0.0.1:{engine_port}",
        "command": [{jupyter!r}, "llm", "serve"],
        "environment": {engine_env!r},
    }},
    {{"name": "tester", "api_token": {token!r}}},
]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service=llm"]}},
    {{
        "name": "server",
        "scopes": [
            "users:activity!user", "access:servers!server", "access:services!service=llm",
        ],
    }},
    {{
        "name": "tester",
        "services": ["tester"],
        "scopes": [
            "admin:users", "admin:servers", "tokens", "access:servers", "access:services",
        ],
    }},
]
c.Spawner.environment = {{"JUPYTER_LLM_ENGINE_URL": {engine_url!r}}}
"""


@dataclass
class Hub:
    proc: subprocess.Popen
    url: str  # the proxy's public URL, ending in "/"
    engine: str  # the engine's API, straight to the service
    token: str  # the tester service's: admin of users and servers
    log: Path

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.url}hub/api/",
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
        )

    def as_tester(self, base: str) -> httpx.Client:
        return httpx.Client(
            base_url=base, headers={"Authorization": f"token {self.token}"}, timeout=30
        )

    def processes(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    require(CHP.exists(), f"configurable-http-proxy is not installed ({CHP}: npm ci in tests/hub)")
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        require(False, "jupyterhub is not installed (the test extra)")
    models = tmp_path / "models"
    store = ModelStore(models)
    gguf = write_demo_model(tmp_path / "long.gguf", DemoModelSpec(context_length=LONG_CTX))
    store.create("long", {"long.gguf": store.add_blob_from_file(gguf)})
    proxy_port, engine_port, token = free_port(), free_port(), secrets.token_hex(16)
    engine = f"http://127.0.0.1:{engine_port}/services/llm/"
    config = HUB_CONFIG.format(
        proxy_port=proxy_port,
        hub_port=free_port(),
        proxy_api_port=free_port(),
        chp=str(CHP),
        proxy_pid=str(tmp_path / "proxy.pid"),
        tmp=tmp_path,
        users=set(USERS),
        engine_port=engine_port,
        jupyter=str(BIN / "jupyter"),
        engine_env={
            "JUPYTER_LLM_MODELS": str(models),
            "JUPYTER_LLM_NUM_PARALLEL": "2",
            "JUPYTER_LLM_NUM_THREADS": "1",
            "JUPYTER_LLM_STREAM_INTERVAL": "0",
        },
        token=token,
        engine_url=engine,
    )
    (tmp_path / "jupyterhub_config.py").write_text(config)
    env = hub_env()
    log = tmp_path / "hub.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(tmp_path / "jupyterhub_config.py")],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    h = Hub(proc, f"http://127.0.0.1:{proxy_port}/", engine, token, log)
    try:
        wait_until(
            lambda: httpx.get(f"{h.url}hub/api/", timeout=5).status_code == 200, 60, "the Hub"
        )
        wait_until(lambda: httpx.get(engine, timeout=5).status_code == 200, 60, "the engine")
        yield h
    finally:
        stop_hub(h)


def hub_env() -> dict[str, str]:
    """This environment without Jupyter's variables, this interpreter's
    commands first, this checkout importable (the Hub passes PATH and
    PYTHONPATH on to its services and servers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def stop_hub(h: Hub) -> None:
    """SIGTERM the Hub (it stops its servers and services), wait; whatever
    outlived it is killed (psutil checks each pid's identity) and fails the test."""
    left_before = h.processes()
    if h.proc.poll() is None:
        h.proc.send_signal(signal.SIGTERM)
        try:
            h.proc.wait(60)
        except subprocess.TimeoutExpired:
            h.proc.kill()
            h.proc.wait(10)
    _, alive = psutil.wait_procs(left_before, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    runners = [p for p in alive if "jupyter_llm.runner" in cmdline(p)]
    assert not runners, f"runners outlived the Hub: {runners}"


def start_servers(h: Hub) -> dict[str, str]:
    """Both users' servers, started together: each user's server URL."""
    with h.api() as api:
        for user in USERS:
            assert api.post(f"users/{user}/server").status_code in (201, 202)

        def ready() -> bool:
            return all(
                api.get(f"users/{u}").json()["servers"].get("", {}).get("ready") for u in USERS
            )

        wait_until(ready, 120, "the users' servers")
    return {user: f"{h.url}user/{user}/" for user in USERS}


@dataclass
class Kernel:
    client: Any  # jupyter_client.BlockingKernelClient
    id: str
    server: str

    def run(self, code: str) -> str:
        return self.client.execute(code)

    def until(self, msg_id: str, match: Callable[[dict], bool], timeout: float, what: str) -> dict:
        return iopub_until(self.client, msg_id, match, timeout, what)


def start_kernels(h: Hub, servers: list[str]) -> list[Kernel]:
    """A kernel started by each user's server (so it finds that server as
    notebooks do), reached through its connection file; all are asked for
    before the first is waited on, so they start together."""
    ids = []
    for server in servers:
        with h.as_tester(server) as s:
            r = s.post("api/kernels", json={"name": "python3"})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    return [connect_kernel(k, server) for k, server in zip(ids, servers, strict=True)]


def connect_kernel(kernel_id: str, server: str) -> Kernel:
    from jupyter_client import BlockingKernelClient

    def connection_file() -> str | None:
        for p in psutil.process_iter():
            for arg in _args(p):
                if arg.endswith(f"kernel-{kernel_id}.json") and os.path.exists(arg):
                    return arg
        return None

    path = wait_until(connection_file, 60, "the kernel's connection file")
    client = BlockingKernelClient()
    client.load_connection_file(path)
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return Kernel(client, kernel_id, server)


def _args(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def loaded(h: Hub) -> list[dict]:
    """The engine's ``/api/ps`` models."""
    with h.as_tester(h.engine) as engine:
        return engine.get("api/ps").json()["models"]


def holders(h: Hub) -> list[dict]:
    models = loaded(h)
    return models[0]["users"] if models else []


BOB_CELL = """
import os, jupyter_llm
stream = jupyter_llm.client().generate(
    model="long", prompt="go on forever", stream=True,
    options={{"num_predict": -1, "num_ctx": {ctx}, "temperature": 0}},
)
n = 0
for part in stream:
    n += 1
    if n == 1:
        print("streaming", flush=True)
    if os.path.exists({stop!r}):
        break
stream.close()  # the connection closes: the engine stops generating
print("left after", n, "chunks", flush=True)
"""


def test_two_hub_users_stream_from_one_engine(hub: Hub, tmp_path: Path):
    started = time.monotonic()
    servers = start_servers(hub)
    alice, bob = start_kernels(hub, [servers[u] for u in USERS])
    try:
        assert (
            alice.client.execute_interactive("%load_ext jupyter_llm", timeout=60)["content"][
                "status"
            ]
            == "ok"
        )
        cell = f"%%llm long -n -1 --num-ctx {LONG_CTX} -t 0\ngo on forever"
        alice_cell = alice.run(cell)

        def tokens_shown(msg: dict) -> bool:
            text = msg["content"].get("data", {}).get("text/markdown", "")
            shown = text not in ("", "…") and not text.startswith("*loading ")
            return msg["msg_type"] == "update_display_data" and shown

        alice.until(alice_cell, tokens_shown, 60, "alice's first tokens")
        stop = tmp_path / "stop-bob"
        bob_cell = bob.run(BOB_CELL.format(ctx=LONG_CTX, stop=str(stop)))

        def printed(text: str) -> Callable[[dict], bool]:
            return lambda m: m["msg_type"] == "stream" and text in m["content"]["text"]

        bob.until(bob_cell, printed("streaming"), 60, "bob's first chunk")

        # both stream now, from the one scheduler, which knows who is who
        assert holders(hub) == [
            {"name": "alice", "running": 1, "queued": 0},
            {"name": "bob", "running": 1, "queued": 0},
        ]
        runners = [p for p in hub.processes() if "jupyter_llm.runner" in cmdline(p)]
        engine = [p for p in hub.processes() if "llm serve" in cmdline(p)]
        assert len(engine) == 1 and runners
        for runner in runners:  # the users' servers started none: every runner is the engine's
            assert engine[0].pid in {a.pid for a in runner.parents()}, cmdline(runner)
        assert not any("jupyter_llm.runner" in cmdline(p) for p in _user_server_children(hub))

        # the users' servers answer for the engine: /api/devices, /api/ps are its own
        with hub.as_tester(f"{servers['alice']}llm/") as mine:
            assert mine.get("api/ps").json()["models"][0]["users"][0]["name"] == "alice"
            assert mine.get("api/devices").status_code == 200
        # bob may not cut alice off: his unload waits until the model is idle
        with hub.as_tester(f"{servers['bob']}llm/") as his:
            unload = his.post("api/generate", json={"model": "long", "keep_alive": 0})
            assert unload.json()["done_reason"] == "unload"
        assert [u["name"] for u in holders(hub)] == ["alice", "bob"]  # both still run

        # alice presses stop (the kernel's interrupt); bob's loop leaves
        with hub.as_tester(servers["alice"]) as s:
            assert s.post(f"api/kernels/{alice.id}/interrupt").status_code == 204
        result = alice.until(
            alice_cell, lambda m: m["msg_type"] == "execute_result", 30, "alice's result"
        )
        assert "interrupted" in result["content"]["data"]["text/markdown"]
        stop.touch()
        bob.until(bob_cell, printed("left after"), 30, "bob's loop to end")
        # each closed connection reached the engine through the user's server, and
        # then, idle, the model went as bob asked
        wait_until(lambda: loaded(hub) == [], 30, "the engine to release and unload the model")
        scraped(hub)

        # the CLI, pointed at a user's server, sees the shared engine's models
        with hub.as_tester(f"{servers['alice']}llm/") as mine:
            load = {"model": "long", "options": {"num_ctx": LONG_CTX}}
            assert mine.post("api/generate", json=load).json()["done_reason"] == "load"
        cli = subprocess.run(
            [str(BIN / "jupyter"), "llm", "ps"],
            env={**hub_env(), "JUPYTER_LLM_URL": servers["bob"], "JUPYTER_LLM_TOKEN": hub.token},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0 and "long:latest" in cli.stdout, cli.stderr

        # SIGTERM stops the engine cleanly: its runners go with it (the Hub then restarts it)
        runners = [p for p in hub.processes() if "jupyter_llm.runner" in cmdline(p)]
        engine[0].send_signal(signal.SIGTERM)  # psutil checks the pid is still that process
        _, alive = psutil.wait_procs([engine[0], *runners], timeout=30)
        assert not alive, f"still running after the engine's SIGTERM: {alive}"
        assert "jupyter-llm engine stopping: unloading every model" in hub.log.read_text()
        wait_until(lambda: httpx.get(hub.engine, timeout=5).status_code == 200, 60, "a new engine")
    finally:
        for k in (alice, bob):
            k.client.stop_channels()
    refused(hub)
    print(f"two Hub users streamed from one engine in {time.monotonic() - started:.1f} s")


def _user_server_children(h: Hub) -> list[psutil.Process]:
    servers = [p for p in h.processes() if "jupyterhub-singleuser" in cmdline(p)]
    assert len(servers) == len(USERS)
    return [c for s in servers for c in s.children(recursive=True)]


def scraped(h: Hub) -> None:
    """The engine's /metrics, to a token with the service's scope: each
    user's request counted under their Hub name, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{h.engine}metrics", headers={"Authorization": f"token {h.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    requests = [
        s
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
        if s.name == "jupyter_llm_requests_total" and s.value > 0
    ]
    users = {s.labels["user"] for s in requests if s.labels["model"] == "long:latest"}
    assert {"alice", "bob"} <= users, requests


def refused(h: Hub) -> None:
    """No token, a bad one, or a user's token without ``access:services``:
    JSON errors, never a page or a traceback; straight or through the proxy."""
    for base in (h.engine, f"{h.url}services/llm/"):
        for headers in ({}, {"Authorization": "token wrong"}):
            r = httpx.post(f"{base}api/chat", headers=headers, json={"model": "long"}, timeout=30)
            assert r.status_code == 403, (base, headers, r.text)
            assert r.headers["Content-Type"].startswith("application/json")
            assert "a JupyterHub token is required" in r.json()["error"]
        assert httpx.get(base, timeout=30).text == "Ollama is running"  # the heartbeat
    with h.api() as api:
        r = api.post("users/alice/tokens", json={"scopes": ["read:users:name!user"]})
        assert r.status_code == 201, r.text
        narrow = r.json()["token"]
    r = httpx.get(f"{h.engine}api/ps", headers={"Authorization": f"token {narrow}"}, timeout=30)
    assert r.status_code == 403
    for headers in ({}, {"Authorization": f"token {narrow}"}):  # metrics: as every route
        refused = httpx.get(f"{h.engine}metrics", headers=headers, timeout=30)
        assert refused.status_code == 403
        assert refused.json()["error"]  # a JSON error, not an error page that failed
    assert "may not use this service" in json.loads(r.text)["error"]


# -- `jupyter llm serve` without a Hub --------------------------------------------------
@pytest.mark.parametrize(
    ("url", "prefix", "expected"),
    [
        ("http://127.0.0.1:8765", "/services/llm/", Where("127.0.0.1", 8765, "/services/llm/")),
        ("http://0.0.0.0:9000/", "services/llm", Where("0.0.0.0", 9000, "/services/llm/")),
        ("http://engine:80", "", Where("engine", 80, "/")),
    ],
)
def test_where_it_listens(url, prefix, expected):
    assert where(url, prefix) == expected


@pytest.mark.parametrize("url", ["127.0.0.1:8765", "https://h:1", "http://h"])
def test_a_url_it_cannot_listen_on(url):
    with pytest.raises(ConfigError, match="http://HOST:PORT"):
        where(url, "/")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no address to listen on"),
        ({"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:1"}, "JUPYTERHUB_API_URL is not set"),
        (
            {
                "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:1",
                "JUPYTERHUB_API_URL": "http://127.0.0.1:2/hub/api",
                "JUPYTER_LLM_ENGINE_URL": "http://127.0.0.1:1/services/llm/",
            },
            "JUPYTER_LLM_ENGINE_URL is for users' servers",
        ),
    ],
)
def test_serve_outside_a_hub_says_what_is_missing(env, message):
    pytest.importorskip("jupyterhub")
    env = {k: v for k, v in hub_env().items() if not k.startswith("JUPYTERHUB")} | env
    done = subprocess.run(
        [str(BIN / "jupyter-llm"), "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and message in done.stderr, done.stderr
