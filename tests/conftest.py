"""The harness tests' shared configuration: what the fast loop (`pytest -m "not slow"`) leaves out
beyond the tests marked `slow` one by one.

A test parametrized with a backend the suite takes only when named (registry.SUITE_OPT_IN:
torch-flex-compiled) is slow: torch.compile builds a program per shape, dtype and configuration
through Inductor's compile worker processes.  Plain `pytest` still runs it.

Under pytest-xdist with at most a worker a CPU (README's `-n auto`), each worker is pinned to a CPU
of its own with one thread a runtime, as the suite lays out its own workers (properties/cores.py):
the processes a test starts (the proof of teeth's suites, `attnspec run`, asv) inherit both, so
two workers' thread pools do not spin against each other.
"""
import os

import pytest

from attnspec.backends.registry import SUITE_OPT_IN
from attnspec.properties import cores


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if worker is not None and 1 < int(worker.get("workercount", 0)) <= cpus:
        os.environ.update(cores.one_cpu_each(os.environ))
        cores.pin({cores.CPU_ENV: "xdist"}, worker=worker["workerid"])


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and any(isinstance(v, str) and v in SUITE_OPT_IN for v in callspec.params.values()):
            item.add_marker(pytest.mark.slow)
