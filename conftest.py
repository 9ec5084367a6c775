"""Loads the attnspec pytest plugin (--backend, --attnspec-json, Hypothesis profiles) for every run."""
pytest_plugins = ["properties.plugin"]
