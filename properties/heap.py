"""Python's cyclic garbage collector in a suite process of our own.

A suite process holds torch's, JAX's and OpenVINO's modules - a few million objects that live
as long as it does - and allocates fast (Hypothesis, NumPy); every full collection walks them
all (~0.12 s each here, ~2 s of a worker's run), and pytest collects five times more when the
session ends (its unraisable-exception check: 1.3-3 s of a worker's exit, measured).  Moving what
exists once a backend has run into the collector's permanent generation (`gc.freeze`) takes
those objects out of every later walk; what a test leaves behind is still collected.

Only in processes the suite owns (``pytest properties``, its xdist workers, `attnspec run`'s
children): `properties.install` inside someone else's test suite leaves their collector alone.
"""
from __future__ import annotations

import gc

_settled: set = set()


def after_first_test_of(backend_name: str) -> None:
    """Freeze the heap the first time a backend's test has run here: its framework is loaded by
    then (imported by its first call), and what the test left over is one test's garbage."""
    if backend_name not in _settled:
        _settled.add(backend_name)
        gc.freeze()


def at_exit() -> None:
    """Nothing of the session needs collecting any more: pytest's final passes walk only what is new."""
    gc.freeze()
