"""Family: the output — agreement with the float64 reference, convexity, the scale.

Agreement is judged by the error budget (specs.error_budget): at most 2 x the error of the
plain same-dtype computation, plus a floor.  Rows with no visible key are not judged.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from attnspec.specs import invariants

from attnspec.properties.judge import agreement, draw_case, fail_unless, output_tolerance
from attnspec.properties.seeds import with_seed_examples
from attnspec.properties.strategies import SCALES


@with_seed_examples
@given(data=st.data())
def test_matches_reference(target, data):
    agreement(target, draw_case(data, target), "matches_reference")


@given(data=st.data())
def test_default_scale(target, data):
    """scale=None means 1/sqrt(E) (seeds 000, 002, 004: not 1/E, not 1)."""
    agreement(target, draw_case(data, target, scales=(None,)), "default_scale")


@given(data=st.data())
def test_explicit_scale_honoured(target, data):
    """An explicit scale replaces 1/sqrt(E) (PyTorch's and JAX's `scale=` argument)."""
    agreement(target, draw_case(data, target, scales=tuple(s for s in SCALES if s is not None)),
              "explicit_scale_honoured")


@with_seed_examples
@given(data=st.data())
def test_convex_combination(target, data):
    """Seed 000: "la salida es una combinación convexa de las filas de V" (within the budget)."""
    case = draw_case(data, target)
    out = target.forward(case)  # (B, H, Lq, Ev)
    vis = case.visible()  # (B, H, Lq, Lk)
    v = np.repeat(case.v, case.dims["H"] // case.dims["Hkv"], axis=-3)  # (B, H, Lk, Ev) each query head's values
    verdict = invariants.convex_combination(out, v, vis, output_tolerance(case, target.budget_dtype))
    fail_unless(verdict, "convex_combination", target, case,
                checks=("print(out, v)  # each output column must stay within the visible values' range",))
