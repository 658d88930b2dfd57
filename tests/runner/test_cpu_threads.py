"""The default thread count: pure functions over fake sysfs/procfs/cgroupfs
trees, the real machine, and the count a real runner reports."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from jupyter_llm.runner.cpu_threads import (
    cgroup_cpu_limit,
    darwin_threads,
    default_threads,
    idle_jiffies,
    linux_threads,
    parse_cpu_list,
    physical_cores,
    run_queue_wait,
)

CPU = "sys/devices/system/cpu"


def smt(cores: int, first: int = 0, package: int = 0) -> dict[str, str]:
    """Topology of ``cores`` two-way SMT cores numbered as Linux does on x86:
    cpu i and cpu i + cores are the siblings of core i."""
    files = {}
    for core in range(cores):
        a, b = first + core, first + core + cores
        for cpu in (a, b):
            files[f"{CPU}/cpu{cpu}/topology/physical_package_id"] = str(package)
            files[f"{CPU}/cpu{cpu}/topology/core_id"] = str(core)
            files[f"{CPU}/cpu{cpu}/topology/thread_siblings_list"] = f"{a},{b}"
    return files


def single(cpus: range, package: int = 0, core_base: int = 100) -> dict[str, str]:
    """One thread per core (no SMT)."""
    files = {}
    for cpu in cpus:
        files[f"{CPU}/cpu{cpu}/topology/physical_package_id"] = str(package)
        files[f"{CPU}/cpu{cpu}/topology/core_id"] = str(core_base + cpu)
    return files


def siblings_only(pairs: list[tuple[int, int]]) -> dict[str, str]:
    """Topology with sibling lists but no core ids."""
    files = {}
    for a, b in pairs:
        for cpu in (a, b):
            files[f"{CPU}/cpu{cpu}/topology/thread_siblings_list"] = f"{a}-{b}"
    return files


def v2(path: str, **limits: str) -> dict[str, str]:
    """A cgroup v2 process in ``path``; ``limits`` maps folders (``_`` for the
    mount root) to their cpu.max."""
    files = {"proc/self/cgroup": f"0::{path}\n"}
    for folder, value in limits.items():
        where = "" if folder == "_" else folder.replace("__", "/") + "/"
        files[f"sys/fs/cgroup/{where}cpu.max"] = value
    return files


def v1(path: str, quota: str, period: str = "100000", mount: str = "cpu,cpuacct") -> dict:
    base = f"sys/fs/cgroup/{mount}{path.rstrip('/')}"
    return {
        "proc/self/cgroup": f"12:memory:/x\n4:cpu,cpuacct:{path}\n1:name=systemd:/\n",
        f"{base}/cpu.cfs_quota_us": quota,
        f"{base}/cpu.cfs_period_us": period,
    }


HYBRID = {  # 4 P-cores with SMT (cpus 0-7, siblings 2k, 2k+1) and 8 E-cores (8-15)
    **{
        f"{CPU}/cpu{cpu}/topology/{name}": value
        for cpu in range(8)
        for name, value in (("physical_package_id", "0"), ("core_id", str(cpu // 2 * 4)))
    },
    **single(range(8, 16), core_base=32),
    "sys/devices/cpu_core/cpus": "0-7",
    "sys/devices/cpu_atom/cpus": "8-15",
    f"{CPU}/online": "0-15",
}


def build(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("5", {5}),
        ("", set()),
        ("0-3,x", set()),
    ],
)
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize(
    ("case", "files", "affinity", "expected"),
    [
        ("plain SMT machine: 4 cores, 8 threads", {**smt(4), f"{CPU}/online": "0-7"}, None, 4),
        ("affinity: two cpus on two cores", smt(4), {0, 1}, 2),
        ("affinity: both siblings of one core", smt(4), {0, 4}, 1),
        ("affinity: both siblings of one core and another", smt(4), {0, 4, 1}, 2),
        ("affinity beats the online list", {**smt(4), f"{CPU}/online": "0-7"}, {2, 6}, 1),
        (
            "two packages: same core ids are different cores",
            {**smt(2), **smt(2, 4, 1), f"{CPU}/online": "0-7"},
            None,
            4,
        ),
        ("no SMT", {**single(range(6)), f"{CPU}/online": "0-5"}, None, 6),
        ("siblings lists only", siblings_only([(0, 1), (2, 3)]), {0, 1, 2, 3}, 2),
        ("v2 quota 1.5 CPUs rounds up", {**smt(4), **v2("/a", a="150000 100000")}, {0, 1, 2, 3}, 2),
        ("v2 quota 0.1 CPUs: at least 1", {**smt(4), **v2("/a", a="10000 100000")}, {0, 1}, 1),
        ("v2 max: no limit", {**smt(4), **v2("/a", a="max 100000")}, set(range(8)), 4),
        (
            "v2 parent's quota is lower",
            {**smt(4), **v2("/a/b", a__b="300000 100000", a="100000 100000")},
            set(range(8)),
            1,
        ),
        (
            "v2 own cgroup not at its host path (container): the mount root's",
            {**smt(4), **v2("/kubepods/pod1/c1", _="200000 100000")},
            set(range(8)),
            2,
        ),
        ("v2 quota above the cores", {**smt(4), **v2("/", _="800000 100000")}, set(range(8)), 4),
        ("v1 quota", {**smt(4), **v1("/docker/abc", "250000")}, set(range(8)), 3),
        ("v1 quota in the cpu mount", {**smt(4), **v1("/", "50000", mount="cpu")}, {0, 1}, 1),
        ("v1 -1: no limit", {**smt(4), **v1("/docker/abc", "-1")}, set(range(8)), 4),
        ("v1 period 0 is ignored", {**smt(4), **v1("/", "50000", period="0")}, {0, 1}, 2),
        (
            "v1 and v2 both mounted: the lower",
            {
                **smt(4),
                **v1("/", "300000"),
                "proc/self/cgroup": "4:cpu,cpuacct:/\n0::/\n",
                "sys/fs/cgroup/unified/cpu.max": "200000 100000",
            },
            set(range(8)),
            2,
        ),
        ("hybrid: performance cores only", HYBRID, None, 4),
        ("hybrid: affinity on P and E cores", HYBRID, {0, 1, 2, 8, 9}, 2),
        ("hybrid: affinity on E cores only", HYBRID, {8, 9, 10}, 3),
        ("missing topology: each cpu a core", {f"{CPU}/online": "0-3"}, None, 4),
        ("missing sysfs: the affinity's cpus", {}, {0, 1, 2}, 3),
        ("nothing known", {}, None, None),
        ("unreadable cgroup files", {**smt(2), "proc/self/cgroup": "garbage"}, {0, 1, 2, 3}, 2),
    ],
)
def test_linux_threads(tmp_path, case, files, affinity, expected):
    root = build(tmp_path, files)
    mask = frozenset(affinity) if affinity is not None else None
    assert linux_threads(root, mask) == expected, case


def test_physical_cores_and_quota_alone(tmp_path):
    root = build(tmp_path, {**smt(2), **v2("/u", u="50000 100000")})
    assert physical_cores(root, [0, 1, 2, 3]) == 2
    assert cgroup_cpu_limit(root) == 0.5
    assert cgroup_cpu_limit(build(tmp_path / "none", {})) is None


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"hw.perflevel0.physicalcpu": 4, "hw.physicalcpu": 10}, 4),  # Apple silicon
        ({"hw.physicalcpu": 8}, 8),  # Intel Mac: one level
        ({"hw.perflevel0.physicalcpu": 0, "hw.physicalcpu": 6}, 6),
        ({}, None),
    ],
)
def test_darwin_threads(values, expected):
    assert darwin_threads(values.get) == expected


STAT = """cpu  30 0 10 100 5 0 0 0 7 0
cpu0 10 0 5 60 2 0 0 0 7 0
cpu1 20 0 5 40 3 1 1 1 0 0
intr 12345"""


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        ({0}, (62, 77)),  # idle and iowait; all but guest time (in user time already)
        ({0, 1}, (105, 148)),
        ({1, 7}, (43, 71)),  # a CPU proc/stat does not list adds nothing
        ({7}, None),
    ],
)
def test_idle_jiffies(tmp_path, cpus, expected):
    assert idle_jiffies(cpus, build(tmp_path, {"proc/stat": STAT})) == expected


def test_idle_jiffies_unreadable(tmp_path):
    assert idle_jiffies({0}, tmp_path) is None
    assert idle_jiffies({0}, build(tmp_path, {"proc/stat": "cpu0 1 x 3"})) is None


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # the second field of each thread's schedstat: ns runnable but not running
        ({"1/schedstat": "900 40 7", "2/schedstat": "500 2 3"}, 42),
        ({"1/schedstat": "900 40 7", "2/stat": "x"}, 40),  # a thread that ended meanwhile
        ({"1/schedstat": "900 x 7", "2/schedstat": "5"}, None),  # nothing readable
        ({"1/schedstat": "0 0 0", "2/schedstat": "0 0 0"}, None),  # schedstats off: all zero
        ({}, None),
    ],
)
def test_run_queue_wait(tmp_path, files, expected):
    tree = {f"proc/self/task/{name}": text for name, text in files.items()}
    assert run_queue_wait(build(tmp_path, tree)) == expected


def test_run_queue_wait_here():
    """This process's own threads (Linux keeps the count where schedstat exists)."""
    wait = run_queue_wait()
    if Path("/proc/self/schedstat").exists():
        assert wait is not None and wait >= 0
    assert run_queue_wait(Path("/nonexistent")) is None


def test_this_machine():
    count = default_threads()
    assert 1 <= count <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert count <= len(os.sched_getaffinity(0))


# -- through a real server and a real runner ------------------------------------------
class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def load_log():
    logger = logging.getLogger("jupyter_llm.runner_client.proxy")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.messages
    logger.removeHandler(handler)
    logger.setLevel(level)


class TestReachesTheRunner:
    """The setting (trait, else JUPYTER_LLM_NUM_THREADS) and the request's
    ``num_thread`` reach the runner; with neither it uses the default."""

    CASES = {
        "env": ({"num_threads": None}, "3", None, 3),
        "num_thread over env": ({"num_threads": None}, "3", 1, 1),
        "trait over env": ({"num_threads": 1}, "3", None, 1),
        "default": ({"num_threads": 0}, None, None, "default"),
    }

    @pytest.fixture(params=list(CASES))
    def case(self, request, monkeypatch):
        env = self.CASES[request.param][1]
        if env is None:
            monkeypatch.delenv("JUPYTER_LLM_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("JUPYTER_LLM_NUM_THREADS", env)
        return self.CASES[request.param]

    @pytest.fixture
    def llm_config(self, case):
        return case[0]

    async def test_reported_threads(self, case, jp_fetch, jp_serverapp, installed_model, load_log):
        _, _, option, expected = case
        body = {"model": "tiny", "options": {"num_thread": option} if option else {}}
        await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
        scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
        [loaded] = scheduler.loaded_models()
        want = default_threads() if expected == "default" else expected
        assert loaded.runner.info["n_threads"] == want
        adaptive = expected == "default" and want > 1  # runner.thread_tuning: a set count is kept
        assert loaded.runner.info["adaptive_threads"] == adaptive
        [line] = [m for m in load_log if "loaded the model" in m]
        assert f"{want} CPU threads" in line
        assert ("fewer while other work holds the cores" in line) == adaptive
        # /api/ps: as the request ended (a tuned runner may have moved), and as loaded
        ps = json.loads((await jp_fetch("llm", "api", "ps")).body)
        [shown] = ps["models"]
        now = shown["threads"].pop("now")
        assert shown["threads"] == {"loaded": want, "adaptive": adaptive}
        assert 1 <= now <= want and (adaptive or now == want)
