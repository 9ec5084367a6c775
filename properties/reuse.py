"""One strategy object per distinct argument list, reused by every draw that asks for it.

Hypothesis validates and labels each new strategy object the first time it draws from it
(~0.1 ms; measured with Hypothesis 6.155: 40 draws an example from fresh ``sampled_from``
objects took 6.4 ms an example, from reused ones 2.2 ms).  A drawn problem asked for ~30 fresh
objects - most of the suite's time on a fast backend.  Strategy objects are immutable, so the
same arguments can share one: the choices drawn, and so every problem and its shrinking, are
unchanged.  Unhashable arguments (a plug-in's own capabilities with a list in them) build a
fresh object as before.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

MAX_KEPT = 4096  # distinct argument lists kept per factory (bias room is a float: new ones keep coming)


def reused(factory):
    """`factory` (a strategy constructor or an @st.composite function), remembering its results."""
    kept: dict = {}

    @functools.wraps(factory)
    def get(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            return factory(*args, **kwargs)
        found = kept.get(key)
        if found is None:
            if len(kept) >= MAX_KEPT:
                kept.clear()
            found = kept[key] = factory(*args, **kwargs)
        return found

    return get


sampled = reused(st.sampled_from)  # a tuple of choices (a list is unhashable: no reuse)
integers = reused(st.integers)
booleans = st.booleans()


@reused
def binary(n: int):
    """Exactly n bytes."""
    return st.binary(min_size=n, max_size=n)
