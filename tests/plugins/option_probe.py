"""A tiny pytest plugin for the harness's tests: writes the options a run ended up with to the JSON
file named by $OPTION_PROBE_TO once every plugin has configured the run (``-p tests.plugins.option_probe``).

With $OPTION_PROBE_EXIT set it then ends the run (exit status 0) before any test or xdist worker
starts: enough to see whether the attnspec plugin rewrote -n, --dist, -p or --hypothesis-seed.
"""
from __future__ import annotations

import json
import os

import pytest

KEYS = ("numprocesses", "dist", "loadscopereorder", "plugins", "hypothesis_seed", "attnspec_backend")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    path = os.environ.get("OPTION_PROBE_TO")
    if not path or hasattr(config, "workerinput"):
        return
    seen = {k: getattr(config.option, k, None) for k in KEYS}
    seen["attnspec_workers"] = getattr(config, "_attnspec_workers", 0)
    seen["suite"] = getattr(config, "_attnspec_suite", None)
    with open(path, "w") as f:
        json.dump(seen, f, default=str)
    if os.environ.get("OPTION_PROBE_EXIT"):
        pytest.exit("option probe: the options were written", returncode=0)
