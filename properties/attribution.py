"""The second step after a failure, explicit: which optional features a counterexample needs.

Run by properties/outcomes.py only after a property failed (never on the common path, which
explores once): delta debugging over the optional features the counterexample uses, then a
fresh exploration without those it needs.
"""
from __future__ import annotations

from attnspec.properties.explore import Counterexample, Exploration, attempt, examples_for, explore
from attnspec.properties.target import Declined
from attnspec.specs.fields import FEATURE_TEXT, FEATURES


def attribute(failure: Counterexample, options: Exploration) -> str:
    """'fails only with grouped heads: 6 draws without them passed', or '' when no feature explains it.

    Each optional feature the counterexample uses is turned off in turn (the same case otherwise);
    those whose removal makes it pass are the ones it needs.  Then the property runs again on fresh
    draws that avoid them: if those pass too, the failure is the features', not the kernel's core.
    """
    prop, target, case = failure.prop, failure.target, failure.case
    if prop.grid is not None:
        return ""
    fixed = set(prop.constraints(target).need)
    used = [f for f in FEATURES if f in case.features and f not in fixed]
    needed = []
    for feature in used:
        try:
            attempt(prop, target, case.without(feature), failure.params)
        except (Counterexample, Declined, Exception):  # noqa: BLE001 - still failing, or not comparable
            continue
        needed.append(feature)
    if not needed:
        return ""
    words = " and ".join(FEATURE_TEXT[f] for f in needed)
    n = examples_for(prop, options)
    try:
        again = explore(prop, target, options, examples=n, avoid=frozenset(needed), seeds=False, shrink=False)
    except BaseException as e:  # noqa: BLE001 - a skip (nothing left to draw) or a harness fault
        return f"fails only with {words} (this counterexample passes without it; no draw without it: {e})"
    if again is None:
        return f"fails only with {words}: {n} draws without it passed"
    return f"needs {words} here, but fails without it too ({again.verdict.message.splitlines()[0]})"
