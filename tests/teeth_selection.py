"""pytest plugin of the proof of teeth's suite run (``-p tests.teeth_selection``): each broken
implementation runs its expected family's properties and the semantics probes, each correct one
the whole suite.

The proof asserts that every broken implementation is rejected by a property of its family
(`Entry.catches`, tests/teeth_report.expected); what the other families make of a kernel whose bug
is known proves nothing more, and it was more than half of the suite run's work.  The semantics
and conventions probes (one fixed problem each) stay for every implementation: a declared
question ("empty_lse", "batch_invariant") is answered by a probe whose test bears another name.
A correct implementation still runs every property: a false alarm can come from any of them.
"""
from __future__ import annotations

import os

import pytest

from tests import teeth_report
from tests.broken import BROKEN

# the modules whose probes answer the semantics questions (properties/test_semantics.py's `answer`)
PROBE_MODULES = ("test_semantics.py", "test_conventions.py")


def catches_by_name() -> dict:
    """Each broken implementation's names in the suite's results -> its expected family."""
    return {name: entry.catches for entry in BROKEN for name in teeth_report.names(entry)}


def kept(backend: str, prop: str, module: str, catches: dict) -> bool:
    """Whether the suite runs `prop` (a property's name, without "test_") on `backend`."""
    if backend not in catches or os.path.basename(module) in PROBE_MODULES:
        return True
    return any(c in prop for c in catches[backend])


@pytest.hookimpl(trylast=True)  # after the suite's plugin (its loadgroup order, when it spreads the run itself)
def pytest_collection_modifyitems(config, items):
    catches, keep, drop = catches_by_name(), [], []
    for item in items:
        callspec = getattr(item, "callspec", None)  # a suite test is parametrized by its Target
        target = callspec.params.get("target") if callspec else None
        run = target is None or kept(target.name, item.originalname.removeprefix("test_"), str(item.path), catches)
        (keep if run else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
