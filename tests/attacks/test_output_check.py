"""Attack: a ``format`` whose grammar makes the model write forty x's, with a
``patternProperties`` pattern (which the grammar ignores) that Python's
regular expressions take hours to run on them. The output check ran
jsonschema in a server thread before the final chunk: ``re`` never lets go
of the GIL, so the whole server froze for good. Now the check runs after the
answer, in a helper process, under ``output_check_cpu``; the answer and other
users' requests go on, and the log says the output was not checked."""

from __future__ import annotations

import logging
from dataclasses import replace

from jupyter_llm.api import output_check
from jupyter_llm.request.limits import OUTPUT_CHECK_CPU

FORTY_XS = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^x{40}$"}},
    "required": ["a"],
    "patternProperties": {"^a$": {"pattern": "^(x+x+)+y$"}},
}


async def test_a_check_that_would_backtrack_for_hours_stops_at_its_cpu_limit(
    users, installed_model, caplog, monkeypatch
):
    # a quarter of its second: the helper runs at the lowest priority, and a
    # busy test machine gives it little CPU time
    monkeypatch.setattr(output_check, "OUTPUT_CHECK_CPU", replace(OUTPUT_CHECK_CPU, value=0.25))
    attacker, victim = users
    body = {
        "model": "tiny",
        "prompt": "hi",
        "stream": False,
        "format": FORTY_XS,
        "options": {"num_predict": 200, "temperature": 0},
    }
    with caplog.at_level(logging.WARNING, logger="jupyter_llm.api.output_check"):
        status, answer = await attacker.json("api/generate", body)
        assert status == 200, answer
        assert answer["response"].replace(" ", "") == '{"a":"' + "x" * 40 + '"}'
        # the check needs a quarter second of a helper's CPU to give up: under way now
        assert output_check._pending
        assert (await victim.fetch("api/tags")).code == 200
        await output_check.checks_done()
    assert "not checked: the check took over 0.25 s of CPU (output_check_cpu)" in caplog.text
