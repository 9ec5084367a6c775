"""attnspec's checkout: its suite's pytest plugin and Hypothesis profile for every run here.

Installed attnspec registers the plugin through its pytest11 entry point ("attnspec"); loading
it again from here would register one module twice, so this file loads it only when the entry
point did not (PYTEST_DISABLE_PLUGIN_AUTOLOAD set).  The checkout's own tests (tests/) run under
the suite's profile too (no deadline; dev's example counts), as they always have; a user's
project gets neither (the plugin stays inert there).
"""
import sys

pytest_plugins = [] if "attnspec.properties.plugin" in sys.modules else ["attnspec.properties.plugin"]


def pytest_configure(config):
    from attnspec.properties import profiles

    if not config.getoption("hypothesis_profile", None):
        try:
            profiles.load(profiles.choose())
        except ValueError:  # a bad ATTNSPEC_PROFILE: the plugin says so for runs of the suite
            profiles.load("dev")
