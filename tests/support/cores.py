"""How many CPU threads a test's own engine decodes on: the CPUs this process
may use, as a runner's default counts them (``runner.cpu_threads``). Under
``make test`` each pytest-xdist worker keeps to CPUs of its own
(tests/conftest.py), so this is 1 there and every core when run alone; more
threads than CPUs spin at llama.cpp's barriers waiting for each other."""

from jupyter_llm.runner.cpu_threads import default_threads


def cores() -> int:
    """Read when asked: a module imported before the worker took its CPUs
    would otherwise keep the whole machine's count."""
    return default_threads()
