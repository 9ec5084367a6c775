"""A pytest plugin for the proof of teeth's run of the suite (``-p tests.teeth_plugin``): shorter shrinking.

The suite shrinks each failure for up to 20 s of wall time (properties/profiles.py); a broken
implementation fails several properties in every dtype it declares, so the teeth run would spend
most of its time shrinking, and more of it on a fast, idle machine than on a loaded one.  Whether
a bug is caught does not depend on shrinking - only how small the printed counterexample is - so
this run shrinks each failure for at most TEETH_SHRINK_SECONDS.  The suite lowers Hypothesis'
engine constant the same way, as ``min(current, its own)``, so the smaller cap set here holds.
"""
from __future__ import annotations

TEETH_SHRINK_SECONDS = 4


def pytest_configure(config):
    try:
        from hypothesis.internal.conjecture import engine
        engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, TEETH_SHRINK_SECONDS)
    except (ImportError, AttributeError):  # another Hypothesis: the suite's own limit applies
        pass
