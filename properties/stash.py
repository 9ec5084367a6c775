"""What a run of the suite keeps in pytest's own per-run store, ``config.stash``, under typed keys.

Per run, not per process: ``pytest.main()`` may run twice in one process (pytester does).
"""
from __future__ import annotations

import pytest

RUN = pytest.StashKey["object | None"]()         # options.SuiteRun: what the run explores; None: a bad option
IN_SUITE = pytest.StashKey[bool]()               # whether this run is the suite's (options.runs_suite)
TARGETS = pytest.StashKey[dict]()                # backend names -> their Targets, resolved once
ROWS = pytest.StashKey[dict]()                   # {"conformance": [...], "semantics": [...]} of the run
ROW_STREAM = pytest.StashKey["object | None"]()  # the open --attnspec-rows file, or None
WORKERS = pytest.StashKey[int]()                 # pytest-xdist workers the suite laid itself over (cores.py)
COLLECTED_SENT = pytest.StashKey[bool]()         # the row stream has its "collected" line (xdist: once)
