"""Real runner processes on a generated model."""

import asyncio
import os
import signal

import psutil
import pytest

from jupyter_llm.errors import ModelLoadFailed, RunnerFailed
from jupyter_llm.runner.discovery import discover_raw_devices
from jupyter_llm.runner.engine import split_at_stop
from jupyter_llm.runner.model import LoadSpec, start_model_runner
from jupyter_llm.runner.process import describe_exit

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


async def collect(runner, **request):
    texts, done = [], None
    async for batch in runner.complete(**request):
        for message in batch:
            if message["type"] == "token":
                texts.append(message["text"])
            else:
                done = message
    return "".join(texts), done


@pytest.fixture
def runner(demo_gguf, jp_asyncio_loop):
    """A real runner with the demo model loaded (the test's loop drives it)."""
    spec = LoadSpec(path=str(demo_gguf), n_ctx=512, n_threads=2)
    r = jp_asyncio_loop.run_until_complete(start_model_runner(spec, load_timeout=60))
    yield r
    jp_asyncio_loop.run_until_complete(r.close())
    assert not psutil.pid_exists(r.pid) or psutil.Process(r.pid).status() == "zombie"


async def test_generate_is_deterministic_and_counted(runner):
    opts = {**GREEDY, "num_predict": 12}
    text1, done1 = await collect(runner, prompt="hello", options=opts)
    text2, done2 = await collect(runner, prompt="hello", options=opts)
    assert text1 == text2 and text1
    assert done1["eval_count"] == 12 and done1["done_reason"] == "length"
    assert done1["prompt_eval_count"] == len(
        (await runner.process.call("tokenize", text="hello"))["tokens"]
    )
    assert done2["eval_duration"] > 0


async def test_chat_uses_template(runner):
    _, done = await collect(
        runner, messages=[{"role": "user", "content": "hi"}], options={**GREEDY, "num_predict": 4}
    )
    assert done["prompt_eval_count"] > 5  # template tokens were added


async def test_stop_sequence(runner):
    text, _ = await collect(runner, prompt="hello", options={**GREEDY, "num_predict": 40})
    stop = text[5:8]
    short, done = await collect(
        runner, prompt="hello", options={**GREEDY, "num_predict": 40, "stop": [stop]}
    )
    assert done["done_reason"] == "stop"
    assert stop not in short and text.startswith(short)


async def test_cancel_stops_generation(runner):
    stream = runner.complete(prompt="hello", options={**GREEDY, "num_predict": 100000})
    async for _ in stream:
        break
    await stream.aclose()  # closing the stream sends cancel
    # the runner is free again and answers the next request promptly
    _, done = await asyncio.wait_for(
        collect(runner, prompt="x", options={**GREEDY, "num_predict": 2}), 10
    )
    assert done["eval_count"] == 2


async def test_health_while_generating(runner):
    stream = runner.complete(prompt="hello", options={**GREEDY, "num_predict": 100000})
    async for _ in stream:
        break
    assert await runner.health(timeout=5)
    await stream.aclose()


async def test_sigkill_fails_in_flight_request_with_cause(runner):
    stream = runner.complete(prompt="hello", options={**GREEDY, "num_predict": 100000})
    with pytest.raises(RunnerFailed, match="SIGKILL"):
        async for _ in stream:
            os.kill(runner.pid, signal.SIGKILL)
    assert not runner.alive
    with pytest.raises(RunnerFailed, match="SIGKILL"):
        await collect(runner, prompt="x", options={"num_predict": 1})


async def test_load_failure_names_cause_and_leaves_no_runner(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadFailed, match="failed to load"):
        await start_model_runner(LoadSpec(path=str(bad), n_ctx=256), load_timeout=60)
    me = psutil.Process()
    assert not [c for c in me.children() if "jupyter_llm.runner" in " ".join(c.cmdline())]


async def test_discovery_reports_cpu():
    devices = await discover_raw_devices()
    cpu = [d for d in devices if d["type"] == "cpu"]
    assert cpu and cpu[0]["library"] == "CPU" and cpu[0]["name"]


@pytest.mark.parametrize(
    ("pending", "stops", "expected"),
    [
        ("hello world", ["wor"], ("hello ", True)),
        ("hello wo", ["world"], ("hello ", False)),
        ("hello", ["x"], ("hello", False)),
        ("abc", [""], ("abc", False)),
        ("a<|im", ["<|im_end|>", "zz"], ("a", False)),
    ],
)
def test_split_at_stop(pending, stops, expected):
    assert split_at_stop(pending, stops) == expected


@pytest.mark.parametrize(
    ("code", "text"),
    [(-9, "was killed by SIGKILL"), (-11, "was killed by SIGSEGV"), (3, "status 3")],
)
def test_describe_exit(code, text):
    assert text in describe_exit(code)


async def test_load_stall_timer_gives_up_and_leaves_no_runner(tmp_path, demo_gguf):
    # an "interpreter" that starts and then never answers: a hung load
    hung = tmp_path / "hung-python"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    spec = LoadSpec(path=str(demo_gguf), n_ctx=256)
    with pytest.raises(ModelLoadFailed, match="no progress for"):
        await start_model_runner(spec, python=str(hung), load_timeout=0.5)
    me = psutil.Process()
    assert not [c for c in me.children(recursive=True) if "sleep" in " ".join(c.cmdline())]


async def test_load_reports_progress(runner):
    assert runner.progress == 1.0
    assert runner.measured["cpu"]["weights"] > 0


def test_token_stream_groups_fast_tokens_only():
    import time

    from jupyter_llm.runner.service import TokenStream

    sent: list[str] = []
    out = TokenStream(sent.append, interval=0.05)
    out.add("a")  # the first piece goes at once
    out.add("b")
    out.add("c")  # grouped: the interval has not passed
    assert sent == ["a"]
    time.sleep(0.06)
    out.add("d")  # a slow token goes straight away, with what waited
    assert sent == ["a", "bcd"]
    out.add("e")
    out.flush()
    assert sent == ["a", "bcd", "e"]


@pytest.mark.parametrize(
    "extra",
    [
        {"typical_p": 0.5},
        {"mirostat": 1},
        {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
        {"top_k": 1},
        {"min_p": 0.2},
        {"presence_penalty": 1.5, "frequency_penalty": 0.5},
    ],
)
async def test_sampling_options_change_the_output(runner, extra):
    base = {"temperature": 1.5, "seed": 7, "num_predict": 24, "repeat_penalty": 1.0}
    plain, _ = await collect(runner, prompt="hello", options=base)
    again, _ = await collect(runner, prompt="hello", options=base)
    assert plain == again  # seeded: reproducible
    varied, done = await collect(runner, prompt="hello", options={**base, **extra})
    assert done["eval_count"] == 24 and varied != plain
