"""Family: the output — agreement with the float64 reference, convexity, the scale.

Agreement is judged by the error budget (specs.error_budget): at most 2 x the error of the
plain same-dtype computation, plus a floor.  Rows with no visible key are not judged.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hypothesis import given
from hypothesis import strategies as st

from specs import error_budget, invariants

from .judge import draw_case, fail_unless, judged_rows, output_tolerance
from .seeds import with_seed_examples
from .strategies import SCALES

_DIFF = ("print(np.abs(out - expected).max())  # rows with no visible key are not judged",)


def _agreement(target, case, prop):
    out = target.forward(case)  # (B, H, Lq, Ev)
    rows = judged_rows(case, target.alignment)  # (B, H, Lq)
    verdict = error_budget.check_forward(out, case.q, case.k, case.v, case.visible(target.alignment), False,
                                         case.scale, target.budget_dtype, rows=rows)
    if not verdict and verdict.where is not None:  # an index among the judged rows -> (batch, head, query, col)
        full = tuple(int(i) for i in np.argwhere(rows)[verdict.where[0]]) + tuple(verdict.where[1:])
        verdict = dataclasses.replace(verdict, where=full, message=verdict.message.replace(str(verdict.where), str(full)))
    fail_unless(verdict, prop, target, case, checks=_DIFF)


@with_seed_examples
@given(data=st.data())
def test_matches_reference(target, data):
    _agreement(target, draw_case(data, target), "matches_reference")


@given(data=st.data())
def test_default_scale(target, data):
    """scale=None means 1/sqrt(E) (seeds 000, 002, 004: not 1/E, not 1)."""
    _agreement(target, draw_case(data, target, scales=(None,)), "default_scale")


@given(data=st.data())
def test_explicit_scale_honoured(target, data):
    """An explicit scale replaces 1/sqrt(E) (PyTorch's and JAX's `scale=` argument)."""
    _agreement(target, draw_case(data, target, scales=tuple(s for s in SCALES if s is not None)),
               "explicit_scale_honoured")


@with_seed_examples
@given(data=st.data())
def test_convex_combination(target, data):
    """Seed 000: "la salida es una combinación convexa de las filas de V" (within the budget)."""
    case = draw_case(data, target)
    out = target.forward(case)  # (B, H, Lq, Ev)
    vis = case.visible(target.alignment)  # (B, H, Lq, Lk)
    verdict = invariants.convex_combination(out, case.v, vis, output_tolerance(case, target.alignment, target.budget_dtype))
    fail_unless(verdict, "convex_combination", target, case,
                checks=("print(out, v)  # each output column must stay within the visible values' range",))
