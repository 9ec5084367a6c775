"""attnspec's checkout: its suite's pytest plugin for every run here, and a profile for tests/.

Installed attnspec registers the plugin through its pytest11 entry point ("attnspec"); loading
it again from here would register one module twice, so this file loads it only when the entry
point did not (PYTEST_DISABLE_PLUGIN_AUTOLOAD set).  The harness's own tests (tests/) run under
the suite's dev or ci profile (no deadline; a few examples); the suite's runs load their own.
Its runs keep the JAX backends' compiled programs in ~/.cache/attnspec/jax (ATTNSPEC_JAX_CACHE).
"""
import os
import sys
from pathlib import Path

import pytest

# this project's runs keep JAX's compiled programs across processes (opt-in: backends/jax_programs.py)
os.environ.setdefault("ATTNSPEC_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "attnspec", "jax"))

pytest_plugins = [] if "attnspec.properties.plugin" in sys.modules else ["attnspec.properties.plugin"]


def pytest_configure(config):
    from attnspec.properties import options, profiles

    if config.getoption("hypothesis_profile", None) or options.runs_suite(config):
        return  # Hypothesis' own choice, or the suite's (properties/plugin.py)
    try:
        profiles.load(profiles.chosen() or "dev")
    except ValueError:  # a bad ATTNSPEC_PROFILE: the plugin says so for runs of the suite
        profiles.load("dev")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    """The property suite's tests count as slow here: `pytest -m "not slow"` is the harness's fast loop
    (README, "The fast loop"; in one process the suite alone outlasts it), while a plain `pytest` or
    `pytest properties` runs the suite as before (no -m: the mark selects nothing away).  A run started
    elsewhere (`pytest --pyargs attnspec.properties` over an editable install loads this file too) is not
    this checkout's: its rootdir registers no `slow` mark, and pytest would warn of an unknown one."""
    checkout = Path(__file__).resolve().parent
    if Path(config.rootpath).resolve() != checkout:
        return
    suite = checkout / "properties"
    for item in items:
        if suite in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)
