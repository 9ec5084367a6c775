"""Backends: what the suite judges and the benchmarks time (see base.py, registry.py).

Importing this package loads no framework; each backend imports its own in `load`.
`declare` attaches declarations to a plain-function plug-in (backends/plain.py).
"""
from attnspec.backends.plain import declare

__all__ = ["declare"]
