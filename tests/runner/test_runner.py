"""Real runner processes on a generated model."""

import asyncio
import re
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from endless import ENDLESS_CONTEXT, FOREVER
from waiting import until

from jupyter_llm.request.errors import (
    AllocationFailed,
    InvalidRequest,
    ModelLoadFailed,
    RunnerFailed,
)
from jupyter_llm.runner.protocol import Complete, LoadParams, fields_of
from jupyter_llm.runner.stops import StopScanner
from jupyter_llm.runner_client.device_probe import discover_raw_devices
from jupyter_llm.runner_client.launch import LoadSpec
from jupyter_llm.runner_client.process import RunnerProcess, describe_exit
from jupyter_llm.runner_client.proxy import start_runner_with

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


async def collect(runner, **request):
    texts, done = [], None
    async for batch in runner.complete(Complete(**request)):
        for message in batch:
            if message["type"] == "token":
                texts.append(message["text"])
            else:
                done = message
    return "".join(texts), done


def running(spec: LoadSpec, loop: asyncio.AbstractEventLoop):
    """A real runner loaded with ``spec`` (the test's loop drives it), closed after."""
    r = loop.run_until_complete(start_runner_with(spec, load_timeout=60))
    yield r
    loop.run_until_complete(r.close())
    assert not psutil.pid_exists(r.pid) or psutil.Process(r.pid).status() == "zombie"


@pytest.fixture
def runner(demo_gguf, jp_asyncio_loop):
    """A real runner with the demo model loaded."""
    yield from running(LoadSpec(path=str(demo_gguf), n_ctx=512, n_threads=1), jp_asyncio_loop)


@pytest.fixture
def endless_runner(endless_gguf, jp_asyncio_loop):
    """A real runner whose answers outlast the test (tests/support/endless.py)."""
    spec = LoadSpec(path=str(endless_gguf), n_ctx=ENDLESS_CONTEXT, n_threads=1)
    yield from running(spec, jp_asyncio_loop)


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
    stops = ["\x01never", stop]
    short, done = await collect(
        runner, prompt="hello", options={**GREEDY, "num_predict": 40, "stop": stops}
    )
    assert done["done_reason"] == "stop"
    assert done["stop_sequence"] == stop  # which one ended it (Anthropic's stop_sequence)
    assert stop not in short and text.startswith(short)
    _, done = await collect(runner, prompt="hello", options={**GREEDY, "num_predict": 3})
    assert done["stop_sequence"] == ""  # none ended it


async def test_cancel_stops_generation(endless_runner):
    stream = endless_runner.complete(
        Complete(prompt="hello", options={**GREEDY, "num_predict": FOREVER})
    )
    async for _ in stream:
        break
    await stream.aclose()  # closing the stream sends cancel
    # the runner is free again and answers the next request promptly
    _, done = await asyncio.wait_for(
        collect(endless_runner, prompt="x", options={**GREEDY, "num_predict": 2}), 10
    )
    assert done["eval_count"] == 2


async def test_a_request_whose_reader_stopped_is_cancelled_past_its_backlog(
    endless_runner, monkeypatch
):
    """A reader that takes nothing more (a client that reads nothing, its
    flush waiting) would hold the whole answer in the server: past
    ``MAX_BACKLOG`` replies the request is cancelled in the runner."""
    from jupyter_llm.runner_client import process

    monkeypatch.setattr(process, "MAX_BACKLOG", 16)
    options = {**GREEDY, "num_predict": FOREVER}
    stream = endless_runner.complete(Complete(prompt="hello", options=options, stream_interval=0))
    # sent, and at most its first batch read (on a busy machine, not even that
    # before the backlog fills); then nothing is read
    first = asyncio.ensure_future(anext(stream))
    # its first batch read (or failed), then no longer pending: cancelled by the backlog
    # (pending is empty too before the request is sent)
    await until(
        lambda: first.done() and not endless_runner.process._pending,
        60,
        "the backlog to cancel the request",
    )
    with pytest.raises(RunnerFailed, match=r"fell 16 replies \([\d,]+ bytes\) behind"):
        await first
        async for _ in stream:
            pass
    _, done = await asyncio.wait_for(
        collect(endless_runner, prompt="x", options={**GREEDY, "num_predict": 2}), 30
    )
    assert done["eval_count"] == 2  # the runner is free: the request was cancelled there


async def test_a_reader_that_stopped_is_cancelled_past_its_backlog_bytes(
    endless_runner, monkeypatch
):
    """Replies with logprobs are large (a token message of 256 tokens' top 20
    is 500 KB): past ``MAX_BACKLOG_BYTES`` of them waiting, the request is
    cancelled, however few the messages."""
    from jupyter_llm.runner_client import process

    monkeypatch.setattr(process, "MAX_BACKLOG_BYTES", 64 << 10)
    options = {**GREEDY, "num_predict": FOREVER}
    request = Complete(
        prompt="hello", options=options, stream_interval=0, logprobs=True, top_logprobs=20
    )
    stream = endless_runner.complete(request)
    first = asyncio.ensure_future(anext(stream))
    await until(
        lambda: first.done() and not endless_runner.process._pending,
        60,
        "the backlog's bytes to cancel the request",
    )
    with pytest.raises(RunnerFailed, match=r"fell \d+ replies \(([\d,]+) bytes\) behind") as e:
        await first
        async for _ in stream:
            pass
    held = int(re.search(r"\(([\d,]+) bytes\)", str(e.value)).group(1).replace(",", ""))
    assert held > 64 << 10
    assert not endless_runner.process._backlog  # forgotten with the request


async def test_health_while_generating(endless_runner):
    stream = endless_runner.complete(
        Complete(prompt="hello", options={**GREEDY, "num_predict": FOREVER})
    )
    async for _ in stream:
        break
    assert await endless_runner.health(timeout=5)
    await stream.aclose()


async def test_sigkill_fails_in_flight_request_with_cause(endless_runner):
    process = psutil.Process(endless_runner.pid)  # psutil refuses to signal a reused pid
    stream = endless_runner.complete(
        Complete(prompt="hello", options={**GREEDY, "num_predict": FOREVER})
    )
    with pytest.raises(RunnerFailed, match="SIGKILL"):
        async for _ in stream:
            if process.is_running():
                process.send_signal(signal.SIGKILL)
    assert not endless_runner.alive
    with pytest.raises(RunnerFailed, match="SIGKILL"):
        await collect(endless_runner, prompt="x", options={"num_predict": 1})


async def test_load_failure_names_cause_and_leaves_no_runner(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadFailed, match="failed to load"):
        await start_runner_with(LoadSpec(path=str(bad), n_ctx=256), load_timeout=60)
    me = psutil.Process()
    assert not [c for c in me.children() if "jupyter_llm.runner" in " ".join(c.cmdline())]


def wrapper(tmp_path, name: str, body: str):
    """An executable standing in for the runner's interpreter (the ``python``
    setting): a shell script that ends by exec-ing the real one."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def long_context_gguf(tmp_path_factory):
    """A model whose KV cache at its full 1M-token context needs 4 GiB."""
    from jupyter_llm.demo import DemoModelSpec, write_demo_model

    spec = DemoModelSpec(n_embd=256, n_layer=4, n_head=4, n_head_kv=4, context_length=1 << 20)
    return write_demo_model(tmp_path_factory.mktemp("long") / "long.gguf", spec)


async def test_real_allocation_failure_is_typed(tmp_path, long_context_gguf):
    # a runner under an address-space limit 1.5 GiB above what it needs with a
    # small context: the model loads, a 4 GiB KV cache cannot, and llama.cpp
    # says so in its log
    small = LoadSpec(path=str(long_context_gguf), n_ctx=1024, n_threads=1)
    runner = await start_runner_with(small, load_timeout=60)
    needed = psutil.Process(runner.pid).memory_info().vms
    await runner.close()
    limit_kib = (needed + (3 << 29)) >> 10
    limited = wrapper(
        tmp_path, "limited-python", f'ulimit -v {limit_kib}\nexec {sys.executable} "$@"'
    )
    runner = await start_runner_with(small, python=limited, load_timeout=60)
    await runner.close()  # the limit leaves room for the model itself
    huge = LoadSpec(path=str(long_context_gguf), n_ctx=1 << 20, n_threads=1)
    with pytest.raises(AllocationFailed, match="failed to allocate"):
        await start_runner_with(huge, python=limited, load_timeout=60)
    me = psutil.Process()
    assert not [c for c in me.children() if "jupyter_llm.runner" in " ".join(c.cmdline())]


async def test_other_load_failures_are_not_allocation_failures(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadFailed) as failure:
        await start_runner_with(LoadSpec(path=str(bad), n_ctx=256), load_timeout=60)
    assert not isinstance(failure.value, AllocationFailed)


async def test_health_reports_main_loop_progress(endless_runner):
    idle = await endless_runner.process.call("health")
    assert idle["busy"] is None and idle["stalled_for"] == 0
    stream = endless_runner.complete(
        Complete(prompt="hello", options={**GREEDY, "num_predict": FOREVER})
    )
    async for _ in stream:
        break
    first = await endless_runner.process.call("health")
    async for _ in stream:  # more tokens: more progress
        break
    second = await endless_runner.process.call("health")
    await stream.aclose()
    assert first["busy"] is not None and second["progress"] > first["progress"]


async def test_a_stuck_runner_is_killed_and_its_request_fails(tmp_path, demo_gguf):
    script = Path(__file__).parents[1] / "support" / "stuck_runner.py"
    stuck = wrapper(tmp_path, "stuck-python", f'exec {sys.executable} {script} "$@"')
    spec = LoadSpec(path=str(demo_gguf), n_ctx=256, n_threads=1)
    runner = await start_runner_with(spec, python=stuck, load_timeout=5.0)
    try:
        _, done = await collect(runner, prompt="fine", options={**GREEDY, "num_predict": 2})
        assert done["eval_count"] == 2  # a working runner is left alone
        with pytest.raises(RunnerFailed, match="made no progress for 5s and was killed"):
            await asyncio.wait_for(collect(runner, prompt="STUCK", options=GREEDY), 60)
        assert not runner.alive
    finally:
        await runner.close()


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
def test_a_stop_in_one_piece(pending, stops, expected):
    scanner = StopScanner(stops)
    assert scanner.feed(pending) == expected
    assert bool(scanner.hit) == expected[1] and (not scanner.hit or scanner.hit in pending)


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
        await start_runner_with(spec, python=str(hung), load_timeout=0.5)
    me = psutil.Process()
    assert not [c for c in me.children(recursive=True) if "sleep" in " ".join(c.cmdline())]


async def test_load_reports_progress(runner):
    assert runner.progress == 1.0
    assert runner.measured["cpu"]["weights"] > 0


def test_token_stream_groups_fast_tokens_only():
    from jupyter_llm.runner.completion import TokenStream

    sent: list[str] = []
    now = [100.0]
    out = TokenStream(sent.append, interval=0.05, clock=lambda: now[0])
    out.add("a")  # the first piece goes at once
    now[0] += 0.01
    out.add("b")
    out.add("c")  # grouped: the interval has not passed
    assert sent == ["a"]
    now[0] += 0.05
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


# -- a client that leaves during a long prompt -----------------------------------------
def test_prompt_evaluation_checks_for_cancel_between_batches(demo_gguf):
    from jupyter_llm.runner.engine import Engine

    engine = Engine(LoadParams(path=str(demo_gguf), n_ctx=2048, n_batch=16, n_threads=1))
    try:
        prompt = "x" * 1000
        checks = []

        def cancelled() -> bool:  # the client leaves after three checks
            checks.append(True)
            return len(checks) > 3

        done = engine.complete(prompt, GREEDY, emit=lambda text: None, cancelled=cancelled)
        assert done.done_reason == "cancel" and done.eval_count == 0
        assert 0 < done.prompt_eval_count <= 3 * 16 < len(engine.model.tokenize(prompt))
        # what the cache really holds
        assert sum(len(s.cached) for s in engine.slots) == done.prompt_eval_count
    finally:
        engine.close()


async def health_when(runner: Any, busy: bool) -> dict[str, Any] | None:
    """The runner's health reply, if it is (or is not) busy with a request."""
    health = await runner.process.call("health")
    return health if (health["busy"] is not None) == busy else None


async def test_a_cancel_stops_a_long_prompt_in_the_runner(tmp_path, demo_gguf):
    script = Path(__file__).parents[1] / "support" / "gated_runner.py"
    gated = wrapper(tmp_path, "gated-python", f'exec {sys.executable} {script} "$@"')
    spec = LoadSpec(path=str(demo_gguf), n_ctx=2048, n_batch=16, n_threads=1)
    runner = await start_runner_with(spec, python=gated, load_timeout=60)
    try:
        stream = runner.complete(Complete(prompt="x" * 1600, options={**GREEDY, "num_predict": 1}))
        first = asyncio.ensure_future(anext(stream))  # sends the request: 100 chunks
        health = await until(lambda: health_when(runner, busy=True), 60, "the prompt to start")
        first.cancel()  # the client leaves: closing the stream sends cancel
        with pytest.raises(asyncio.CancelledError):
            await first
        after = await until(lambda: health_when(runner, busy=False), 60, "the runner to stop")
        # the gate held the prompt at its third chunk: one more at most, not 97
        assert after["progress"] - health["progress"] < 10
        _, done = await collect(runner, prompt="x", options={**GREEDY, "num_predict": 2})
        assert done["eval_count"] == 2
    finally:
        await runner.close()


# -- a chat template that never ends ---------------------------------------------------
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def endless_template_gguf(tmp_path_factory):
    """The demo model with a chat template of 10^10 loop steps."""
    from jupyter_llm.demo import CHAT_TEMPLATE, DemoModelSpec, write_demo_model

    spec = DemoModelSpec(chat_template=ENDLESS + CHAT_TEMPLATE)
    return write_demo_model(tmp_path_factory.mktemp("endless") / "endless.gguf", spec)


async def test_a_chat_template_that_never_ends_is_refused(endless_template_gguf):
    spec = LoadSpec(path=str(endless_template_gguf), n_ctx=512, n_threads=1)
    runner = await start_runner_with(spec, load_timeout=60)
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "options": GREEDY}
        with pytest.raises(InvalidRequest, match="chat template took"):
            await asyncio.wait_for(collect(runner, **chat), 120)
        assert runner.alive  # the runner goes on: a plain prompt is served at once
        _, done = await collect(runner, prompt="x", options={**GREEDY, "num_predict": 2})
        assert done["eval_count"] == 2
    finally:
        await runner.close()


@pytest.mark.parametrize(
    ("pieces", "stops", "emitted", "hit"),
    [
        (["hel", "lo wor", "ld"], ["world"], "hello ", True),
        (["aab", "aac"], ["aac"], "aab", True),  # a failed partial match restarts inside itself
        (["abab", "abc"], ["ababc"], "ab", True),
        (["<|im", "_end|>x"], ["<|im_end|>"], "", True),
        (["<|im", "_e"], ["<|im_end|>"], "", False),  # all held back: may still become a stop
        (["abc"], ["bc", "abcd"], "a", True),  # the first stop to complete ends the text
        (["x" * 50], ["x" * 40 + "y"], "x" * 10, False),
    ],
)
def test_stop_scanner_streamed(pieces, stops, emitted, hit):
    scanner = StopScanner(stops)
    out, found = "", False
    for piece in pieces:
        text, found = scanner.feed(piece)
        out += text
        if found:
            break
    assert (out, found) == (emitted, hit)


def test_stop_scanner_holds_a_long_stop_fed_one_character_at_a_time():
    """A 16 KiB stop that the text keeps almost matching (the case whose
    check used to grow with the square of the stop's length)."""
    stop = "a" * 16383 + "b"
    scanner = StopScanner([stop])
    emitted = ""
    for _ in range(20000):
        text, hit = scanner.feed("a")
        assert not hit
        emitted += text
    assert emitted == "a" * (20000 - 16383) and len(scanner.pending) == 16383
    text, hit = scanner.feed("b")
    assert (text, hit) == ("", True)


@pytest.mark.parametrize(
    ("op", "fields", "expected"),
    [
        ("complete", {"prompt": "hi", "optoins": {}}, "Complete has no field 'optoins'"),
        ("embed", {"input": ["hi"]}, "Embed has no field 'input'"),
        ("embed", {}, "Embed needs 'inputs'"),
    ],
)
async def test_a_misspelt_field_is_refused_not_dropped(runner, op, fields, expected):
    with pytest.raises(InvalidRequest, match=expected):
        await runner.process.call(op, **fields)
    assert runner.alive  # the request failed, not the runner


async def test_the_load_message_is_checked_and_carries_flash_attention(demo_gguf):
    process = RunnerProcess(label="runner")
    await process.start()
    try:
        with pytest.raises(InvalidRequest, match="LoadParams has no field 'n_cxt'"):
            await process.call("load", path=str(demo_gguf), n_cxt=256)
        with pytest.raises(InvalidRequest, match="flash_attn must be one of auto, on, off"):
            await process.call("load", path=str(demo_gguf), flash_attn=True)
        params = LoadParams(path=str(demo_gguf), n_ctx=256, n_threads=1, flash_attn="off")
        replies = [m async for m in process.stream("load", **fields_of(params))]
        assert replies[-1]["type"] == "result" and replies[-1]["n_ctx"] == 256
    finally:
        await process.close(timeout=5.0)


async def test_the_runner_says_what_it_holds_once_its_embedding_context_is_made(runner):
    """The embeddings' context is made on the first embed, after the load
    reported its buffers (about 140 MiB on Gemma, counted nowhere): the
    embed's end says what the runner holds now, and the proxy's figures
    follow; a request after it, with nothing new held, says nothing."""
    from jupyter_llm.memory.measured import grown
    from jupyter_llm.runner.protocol import Embed

    loaded = runner.measured
    result = await runner.embed(Embed(inputs=["hello world", "the cat sat"]))
    assert "allocations" not in result  # the proxy took them
    more = grown(runner.measured, loaded)
    assert set(more) == {"cpu"}
    assert more["cpu"]["graph"] > 0 and more["cpu"]["kv_cache"] > 0  # its compute, its cache
    assert more["cpu"]["weights"] == 0  # the model's weights are shared
    held = runner.measured
    _, done = await collect(runner, prompt="hello", options={**GREEDY, "num_predict": 2})
    assert done.get("allocations") is None and runner.measured == held


async def test_a_requests_stderr_line_never_reaches_another_users_error(runner, caplog):
    """llama.cpp's grammar parse error quotes the grammar (a user's schema)
    on stderr; the runner's last error line went into the errors of
    requests that failed after it, and into the message every request in
    flight gets when the runner dies. Once the model is loaded only a
    crash's line (GGML_ASSERT, out of memory) is kept."""
    import logging

    caplog.set_level(logging.DEBUG, logger="jupyter_llm.runner_client.process")
    assert runner.process.loaded and runner.process.last_error == ""
    grammar = 'root ::= "SECRET-OF-ANOTHER-USER" ('
    with pytest.raises(InvalidRequest) as refused:
        await collect(runner, prompt="hi", grammar=grammar, options={"num_predict": 2})
    assert "SECRET" not in str(refused.value)
    await until(
        lambda: any("SECRET" in r.getMessage() for r in caplog.records),
        what="llama.cpp's parse error on stderr",
    )
    assert "SECRET" not in runner.process.last_error


async def test_the_exchanges_tokens_come_back_only_when_asked(runner):
    """``done.context`` holds the prompt and every generated token (up to 11
    contexts: 9 MB at a 131k context, decoded on the server's loop). Only
    Ollama's ``/api/generate`` answers with them; the others drop them."""
    opts = {**GREEDY, "num_predict": 4}
    _, plain = await collect(runner, prompt="hello", options=opts)
    _, asked = await collect(runner, prompt="hello", options=opts, with_context=True)
    assert plain["context"] == [] and len(asked["context"]) > 4
