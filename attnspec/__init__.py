"""attnspec: a conformance suite and benchmark harness for scaled dot-product attention.

    from attnspec import declare, install

``declare`` attaches what a plain-function backend declares (attnspec.backends.plain);
``install`` puts the conformance suite into a user's own test module (attnspec.properties).
Importing attnspec loads no framework: both load on first use.
"""
from __future__ import annotations

__all__ = ["declare", "install"]


def __getattr__(name):
    if name == "install":
        from attnspec.properties import install
        return install
    if name == "declare":
        from attnspec.backends.plain import declare
        return declare
    raise AttributeError(f"module 'attnspec' has no attribute {name!r}")
