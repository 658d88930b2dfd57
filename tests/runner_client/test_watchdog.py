"""A runner whose main thread hangs, through a real server: the request fails
with a clear error, the runner is killed, the next request loads a fresh one."""

import json
import sys
from pathlib import Path

import psutil
import pytest

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture
def llm_config():
    return {"load_timeout": 5.0}  # also the stall timer of the load itself


@pytest.fixture(autouse=True)
def stuck_interpreter(tmp_path, monkeypatch):
    script = Path(__file__).parents[1] / "support" / "stuck_runner.py"
    wrapper = tmp_path / "stuck-python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("JUPYTER_LLM_PYTHON", str(wrapper))


async def generate(jp_fetch, prompt: str, **options):
    body = {"model": "tiny", "prompt": prompt, "stream": False, "options": {**GREEDY, **options}}
    r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def test_stuck_runner_fails_its_request_and_the_next_one_reloads(
    jp_fetch, jp_serverapp, installed_model
):
    from tornado.httpclient import HTTPClientError

    scheduler = jp_serverapp.web_app.settings["jupyter_llm"].scheduler
    assert (await generate(jp_fetch, "fine", num_predict=2))["eval_count"] == 2
    stuck = scheduler.loaded_models()[0].runner.pid

    with pytest.raises(HTTPClientError) as failure:
        await generate(jp_fetch, "STUCK", num_predict=2)
    assert failure.value.code == 500
    error = json.loads(failure.value.response.body)["error"]
    assert "made no progress for 5s and was killed" in error
    gone = not psutil.pid_exists(stuck) or psutil.Process(stuck).status() == psutil.STATUS_ZOMBIE
    assert gone

    assert (await generate(jp_fetch, "again", num_predict=3))["eval_count"] == 3
    assert scheduler.loaded_models()[0].runner.pid != stuck
