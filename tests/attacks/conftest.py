"""The attack suite's fixtures; its helpers are in ``harness`` (imported by
name: ``from harness import slowdown``). What the tests measured is printed
at the end of the run (``benchmarks/attacks.py`` runs the suite for it)."""

import harness
import pytest
from harness import users

__all__ = ["users"]


@pytest.fixture(autouse=True)
def _name_the_measurements(request):
    harness.current_test = request.node.nodeid.split("::", 1)[-1]


def pytest_terminal_summary(terminalreporter):
    if not harness.MEASURED:
        return
    terminalreporter.section("attacks: measured")
    for test, text in harness.MEASURED:
        terminalreporter.write_line(f"{test}: {text}")
