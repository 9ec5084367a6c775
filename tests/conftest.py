"""The harness tests' shared configuration: what the fast loop (`pytest -m "not slow"`) leaves out
beyond the tests marked `slow` one by one.

A test parametrized with a backend the suite takes only when named (registry.SUITE_OPT_IN:
torch-flex-compiled) is slow: torch.compile builds a program per shape, dtype and configuration
through Inductor's compile worker processes.  Plain `pytest` still runs it.
"""
import pytest

from attnspec.backends.registry import SUITE_OPT_IN


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and any(isinstance(v, str) and v in SUITE_OPT_IN for v in callspec.params.values()):
            item.add_marker(pytest.mark.slow)
