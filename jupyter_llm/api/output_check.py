"""The check of a structured answer against its schema (``check_output``),
run after the answer went out and away from the server.

The grammar cannot enforce every keyword (``multipleOf``, a pattern in
``patternProperties``...), so an answer is checked against the schema as
sent and what does not match is logged. That check runs jsonschema, whose
patterns are Python regular expressions: one crafted ``pattern`` backtracks
for hours on the output the grammar let through, and ``re`` never lets go
of the GIL. So it runs in a helper process under ``OUTPUT_CHECK_CPU`` seconds
of CPU time (``helper_process.run_limited``), no answer waits for it, and at
most ``PENDING`` are under way at once.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace

from jupyter_llm.grammar.check import OutputFormat, check_output
from jupyter_llm.request import helper_process
from jupyter_llm.request.limits import OUTPUT_CHECK_CPU

log = logging.getLogger(__name__)

# checks under way at most (each holds its answer's text and schema); past it
# an answer is not checked, and the log says so
PENDING = 32
_pending: set[asyncio.Task[None]] = set()


def check_later(fmt: OutputFormat, text: str) -> None:
    """Check ``text`` against ``fmt`` in the background; log what is wrong."""
    if len(_pending) >= PENDING:
        log.warning("structured output not checked: %d checks are under way", PENDING)
        return
    task = asyncio.get_running_loop().create_task(_check(replace(fmt, grammar=""), text))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def checks_done() -> None:
    """Wait for the checks under way (tests; the server's shutdown)."""
    while _pending:
        await asyncio.gather(*_pending, return_exceptions=True)


async def _check(fmt: OutputFormat, text: str) -> None:
    limit = OUTPUT_CHECK_CPU
    try:
        problem = await helper_process.run_limited(limit.value, check_output, fmt, text)
    except helper_process.CpuLimitExceeded:
        log.warning(
            "structured output not checked: the check took over %s %s (%s)",
            limit.value, limit.unit, limit.key,
        )  # fmt: skip
        return
    except (BrokenProcessPool, RuntimeError) as e:  # a helper died; the server is stopping
        log.warning("structured output not checked: %s", e)
        return
    if problem:
        log.warning("structured output check failed: %s", problem)
