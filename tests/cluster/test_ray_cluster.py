"""Runners across a real multi-node Ray cluster on this machine.

One ``ray.cluster_utils.Cluster`` for the module: a head node without GPUs
(runners do not go there) and two worker nodes, each offering Ray one GPU
and simulating a 1 GiB GPU (its own JUPYTER_LLM_SIMULATED_DEVICES, set in
the environment the node's raylet starts with). The engine is a real Jupyter
server with ``ray_address`` set; models are real GGUFs from
``jupyter_llm.demo`` whose 128k-token KV cache (391 MiB estimated) leaves no
room for a second one on a 1 GiB GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient
from waiting import until

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from jupyter_llm.cluster.blobs import BlobMismatch, BlobReceiver, file_digest  # noqa: E402
from jupyter_llm.cluster.ray_cluster import NAMESPACE  # noqa: E402
from jupyter_llm.demo import DemoModelSpec, write_demo_model  # noqa: E402
from jupyter_llm.models.store import ModelStore  # noqa: E402

pytestmark = pytest.mark.timeout(180)

GiB = 1 << 30
NUM_CTX = 131072
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_ctx": NUM_CTX}
NODE_ARGS = {
    "num_cpus": 1,
    "object_store_memory": 80 << 20,
    "include_dashboard": False,
}
# the head runs no runner (no GPUs), no autoscaler (its monitor process) and no log
# monitor (the driver takes no worker logs): about 4 s of a core less to start
HEAD_ARGS = {"num_gpus": 0, "no_monitor": True, "include_log_monitor": False}


def one_gib_gpu() -> str:
    return json.dumps(
        [{"id": "gpu0", "library": "CUDA", "name": "simulated 1 GiB", "total_memory": GiB,
          "free_memory": GiB}]
    )  # fmt: skip


@contextlib.contextmanager
def node_environment(**env: str):
    """The environment a node's raylet (and so its workers) starts with."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class GpuNodes:
    """The cluster and its GPU nodes, by the node id devices carry."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cluster = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, **HEAD_ARGS})
        self.nodes: dict[str, object] = {}
        for _ in range(2):
            self.add()
        ray.init(address=self.cluster.address, namespace=NAMESPACE, log_to_driver=False)

    def add(self) -> str:
        store = self.tmp / f"node-{len(self.nodes)}"
        with node_environment(
            JUPYTER_LLM_SIMULATED_DEVICES=one_gib_gpu(), JUPYTER_LLM_MODELS=str(store)
        ):
            node = self.cluster.add_node(**NODE_ARGS, num_gpus=1)
        short = node.node_id[:12]
        self.nodes[short] = node
        return short

    def ensure(self, count: int = 2) -> None:
        """``count`` GPU nodes, adding those a test killed: only a test that needs
        them pays for a new node (starting one takes seconds)."""
        while len(self.nodes) < count:
            self.add()

    def kill(self, short: str) -> None:
        self.cluster.remove_node(self.nodes.pop(short), allow_graceful=False)

    def close(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def gpu_nodes(tmp_path_factory):
    nodes = GpuNodes(tmp_path_factory.mktemp("ray"))
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory) -> Path:
    spec = DemoModelSpec(n_embd=256, n_head=4, n_head_kv=4, n_ff=256, context_length=NUM_CTX)
    return write_demo_model(tmp_path_factory.mktemp("gguf") / "big.gguf", spec)


@pytest.fixture
def llm_config(gpu_nodes) -> dict:
    gpu_nodes.ensure()
    return {"ray_address": gpu_nodes.cluster.address, "num_parallel": 1}


@pytest.fixture
def big_models(models_dir: Path, big_gguf: Path) -> list[str]:
    store = ModelStore(models_dir)
    digest = store.add_blob_from_file(big_gguf)
    names = ["big1", "big2", "big3"]
    for name in names:
        store.create(name, {"big.gguf": digest})
    return names


async def generate(jp_fetch, model: str, num_predict: int = 2) -> dict:
    body = {"model": model, "prompt": "hi", "stream": False,
            "options": {**GREEDY, "num_predict": num_predict}}  # fmt: skip
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def ps(jp_fetch) -> dict[str, dict]:
    models = json.loads((await jp_fetch("llm", "api", "ps")).body)["models"]
    return {m["name"].split(":")[0]: m for m in models}


def our_actors() -> list[str]:
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"jupyter-llm-{os.getpid()}-")
    ]


def running(pids: list[int]) -> list[int]:
    """The pids still running (a zombie has exited)."""
    alive = [p for p in pids if psutil.pid_exists(p)]
    return [p for p in alive if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


async def gone(pids: list[int]) -> bool:
    """Waits until every pid has exited (the test fails after 30 s)."""
    return await until(
        lambda: not running(pids), 30, f"pids {pids} to exit", ignore=(psutil.NoSuchProcess,)
    )


async def test_models_land_on_separate_nodes_evict_per_node_and_stop_cleanly(
    jp_fetch, jp_serverapp, big_models, gpu_nodes
):
    """One engine, three facts in turn (each would start its own engine, its
    discovery actors and the same two loads): two models that cannot share a
    node land on different nodes; a third evicts on one node only; a clean
    stop leaves no actor and no runner."""
    # -- two models that cannot share a node land on different nodes
    assert (await generate(jp_fetch, "big1"))["eval_count"] == 2
    assert (await generate(jp_fetch, "big2"))["eval_count"] == 2
    loaded = await ps(jp_fetch)
    nodes = {loaded[name]["node"] for name in ("big1", "big2")}
    assert nodes == set(gpu_nodes.nodes)  # one each; the head (no GPUs) gets none
    for m in loaded.values():
        assert [a["device"] for a in m["allocations"]] == [f"{m['node']}/gpu0", f"{m['node']}/cpu"]

    # /api/devices: each device names its node, and the nodes list groups them
    data = json.loads((await jp_fetch("llm", "api", "devices")).body)
    assert {n["id"] for n in data["nodes"]} == set(gpu_nodes.nodes)
    for n in data["nodes"]:
        assert sorted(n["devices"]) == [f"{n['id']}/cpu", f"{n['id']}/gpu0"]
    gpus = {d["node"]: d for d in data["devices"] if d["library"] == "CUDA"}
    for m in loaded.values():
        assert gpus[m["node"]]["free_memory"] == GiB - m["size_vram"]
    assert data["simulated"] is True
    pids = [m["pid"] for m in loaded.values()]
    assert len(our_actors()) == 4  # two discovery actors, two runners
    assert all(psutil.pid_exists(p) for p in pids)

    # -- eviction makes room on one node only
    before = loaded
    await generate(jp_fetch, "big3")  # fits nowhere: one node's model makes room
    after = await ps(jp_fetch)
    assert sorted(after) in (["big1", "big3"], ["big2", "big3"])
    (kept,) = set(after) - {"big3"}
    (evicted,) = {"big1", "big2"} - {kept}
    assert after["big3"]["node"] == before[evicted]["node"]  # its room, on its node
    assert after[kept]["pid"] == before[kept]["pid"]  # the other node's model is untouched
    assert after[kept]["node"] == before[kept]["node"]
    assert await gone([before[evicted]["pid"]])

    # -- a clean stop leaves no actor and no runner
    pids = [m["pid"] for m in after.values()]
    # two discovery actors, two runners: the evicted runner's actor goes once it is killed
    await until(lambda: len(our_actors()) == 4, 30, "the evicted runner's actor to go", poll=0.1)
    assert all(psutil.pid_exists(p) for p in pids)
    await jp_serverapp.extension_manager.stop_all_extensions()
    assert await gone(pids)
    await until(lambda: not our_actors(), 30, "the runner actors to go", poll=0.1)


def test_a_blob_sent_to_a_node_is_verified(tmp_path, big_gguf):
    receiver = BlobReceiver(tmp_path / "blobs")
    digest = file_digest(str(big_gguf))
    data = big_gguf.read_bytes()
    half = len(data) // 2
    receiver.write(digest, 0, data[:half])
    receiver.write(digest, half, data[half:])
    path = receiver.finish(digest)
    assert Path(path).read_bytes() == data
    assert receiver.cached(digest, len(data)) == path
    assert receiver.shared(str(big_gguf), len(data)) and not receiver.shared(str(big_gguf), 1)

    wrong = "sha256:" + "0" * 64
    receiver.write(wrong, 0, data)
    with pytest.raises(BlobMismatch, match="expected sha256:0000"):
        receiver.finish(wrong)
    assert receiver.cached(wrong, len(data)) is None
    assert list((tmp_path / "blobs").iterdir()) == [Path(path)]  # nothing half-done is left


async def test_a_node_without_the_file_gets_a_verified_copy(gpu_nodes, big_gguf):
    """Where a node does not see the engine's path, the blob travels through
    Ray in chunks into the node's own store, checked by its digest."""
    from jupyter_llm.cluster.ray_cluster import RayCluster
    from jupyter_llm.cluster.runner import RayRunner

    cluster = RayCluster(gpu_nodes.cluster.address)
    try:
        # a node killed by an earlier test may still be listed alive for a while
        node = next(n for n in await cluster.nodes() if n.id in gpu_nodes.nodes)
        runner = RayRunner(cluster, node, *cluster.start_runner(node, 0))
        digest = file_digest(str(big_gguf))
        copy = await runner.send(str(big_gguf))
        assert Path(copy).name == digest.replace(":", "-")
        assert str(gpu_nodes.tmp) in copy  # the node's own store, not the engine's
        assert Path(copy).read_bytes() == big_gguf.read_bytes()
        assert await runner.send(str(big_gguf)) == copy  # once per node
        with pytest.raises(BlobMismatch, match=f"arrived with digest {digest}"):
            await runner.send(str(big_gguf), digest="sha256:" + "1" * 64)
        assert runner.alive  # a bad blob is the load's failure, not the node's
    finally:
        cluster.close()


async def test_a_node_without_simulated_devices_runs_the_discovery_runner(gpu_nodes):
    """The discovery actor lists its node's devices through the discovery
    runner (``RunnerProcess``), as a single server does: here on the head,
    whose environment simulates nothing."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from jupyter_llm.cluster.node import NodeDiscovery

    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and not n["Resources"].get("GPU"))
    strategy = NodeAffinitySchedulingStrategy(node_id=head, soft=False)
    actor = ray.remote(num_cpus=0)(NodeDiscovery).options(scheduling_strategy=strategy).remote()
    try:
        devices, simulated, error = await actor.devices.remote({})
        assert (simulated, error) == (False, "")
        assert [d.id for d in devices if not d.is_gpu] == ["cpu"]
    finally:
        ray.kill(actor)


# last in the module: the node it kills is added back only when a later test
# needs two GPU nodes (``GpuNodes.ensure``), which none here does
async def test_a_client_that_leaves_and_a_node_killed_mid_stream(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, big_models, gpu_nodes
):
    """Two facts on one engine (each would start its own, with its discovery
    actors and big1's load): a client that leaves stops the generation on the
    node; a node killed mid-stream costs its requests only."""
    import httpx

    # -- a client that leaves stops the generation on the node: closing the stream
    # cancels the Ray generator, and so the request in the node's runner: its one
    # slot is free for the next request at once
    await generate(jp_fetch, "big1")
    token = jp_serverapp.identity_provider.token
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/generate"
    body = {"model": "big1", "prompt": "go", "options": {**GREEDY, "num_predict": 1_000_000}}
    async with httpx.AsyncClient(headers={"Authorization": f"token {token}"}) as leaving:
        async with leaving.stream("POST", url, json=body, timeout=60) as response:
            async for line in response.aiter_lines():
                if line.strip():
                    assert json.loads(line)["done"] is False
                    break  # leave after the first token
    # a million tokens would take hours: the slot is free only if it was cancelled
    reply = await asyncio.wait_for(generate(jp_fetch, "big1", num_predict=3), 60)
    assert reply["eval_count"] == 3

    # -- a node killed mid-stream costs its requests only
    await generate(jp_fetch, "big2")
    loaded = await ps(jp_fetch)
    doomed = loaded["big1"]["node"]
    first_token = asyncio.Event()
    chunks: dict[str, list[bytes]] = {"big1": [], "big2": []}
    client = AsyncHTTPClient(force_instance=True)

    async def stream(model: str, num_predict: int) -> None:
        def on_chunk(data: bytes) -> None:
            chunks[model].append(data)
            if model == "big1":
                first_token.set()

        options = {**GREEDY, "num_predict": num_predict}
        await client.fetch(
            url,
            method="POST",
            body=json.dumps({"model": model, "prompt": "go", "options": options}),
            streaming_callback=on_chunk,
            headers={"Authorization": f"token {token}"},
            request_timeout=120,
        )

    doomed_stream = asyncio.ensure_future(stream("big1", 1_000_000))
    await asyncio.wait_for(first_token.wait(), 60)
    other_stream = asyncio.ensure_future(stream("big2", 200))  # in flight on the other node
    started = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, gpu_nodes.kill, doomed)
    await asyncio.wait_for(doomed_stream, 60)
    failed_after = time.monotonic() - started
    await asyncio.wait_for(other_stream, 60)

    def lines(model: str) -> list[dict]:
        text = b"".join(chunks[model]).decode()
        return [json.loads(x) for x in text.splitlines() if x.strip()]

    streamed = lines("big1")
    assert streamed[0]["done"] is False  # the node went after the first token
    assert "went away" in streamed[-1]["error"] and doomed in streamed[-1]["error"]
    assert lines("big2")[-1]["done"] is True  # the other node's request was not touched
    assert lines("big2")[-1]["eval_count"] == 200
    print(f"in-flight request failed {failed_after:.1f}s after the node was killed")
    assert await gone([loaded["big1"]["pid"]])  # its runner went with its actor

    # the dead node's model is out of the accounting; the next request loads it
    # on the node that is left (making room there by evicting the idle big2)
    started = time.monotonic()
    print(f"next request at {time.time():.3f}")
    assert (await generate(jp_fetch, "big1"))["eval_count"] == 2
    print(f"the next request succeeded in {time.monotonic() - started:.1f}s")
    after = await ps(jp_fetch)
    assert list(after) == ["big1"] and after["big1"]["node"] != doomed
    data = json.loads((await jp_fetch("llm", "api", "devices")).body)
    assert doomed not in {n["id"] for n in data["nodes"]}
