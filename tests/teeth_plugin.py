"""A pytest plugin for the proof of teeth's run of the suite (``-p tests.teeth_plugin``): bounded shrinking.

The suite shrinks each failure for up to 20 s of wall time (properties/profiles.py).  A broken
implementation fails several properties in every dtype it declares, so the teeth run spent most
of its time shrinking - and a wall-time cap costs *more* CPU on an idle machine than on a loaded
one.  Whether a bug is caught does not depend on shrinking, only how small the printed
counterexample is, so this run bounds shrinking by work: at most TEETH_SHRINKS successful shrinks
a failure (Hypothesis' engine constant, monkeypatchable by design), which measured here keeps the
counterexample's shape as small as full shrinking does (B=1 H=1, Lq and Lk of 2 to 4) at a fifth
of the CPU.  The wall-time cap stays as a safety net (the suite lowers the same constant with
``min(current, its own)``, so the smaller one set here holds).

The draws are derandomized (each test's own fixed seed, whatever the commit): the proof is a
statement about fixed draws that any run repeats; how often a fresh seed catches each bug is
the kill rate (``python -m properties.detection_power --kill-rates``).
"""
from __future__ import annotations

import pytest

TEETH_SHRINKS = 10
TEETH_SHRINK_SECONDS = 8


@pytest.hookimpl(trylast=True)  # after the suite's plugin has loaded its profile
def pytest_configure(config):
    from hypothesis import settings

    settings.register_profile("attnspec-teeth", parent=settings.default, derandomize=True)
    settings.load_profile("attnspec-teeth")
    try:
        from hypothesis.internal.conjecture import engine
        engine.MAX_SHRINKS = min(engine.MAX_SHRINKS, TEETH_SHRINKS)
        engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, TEETH_SHRINK_SECONDS)
    except (ImportError, AttributeError):  # another Hypothesis: the suite's own limits apply
        pass
