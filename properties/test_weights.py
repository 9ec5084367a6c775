"""Family: the attention weights, probed with V = identity (Ev = Lk): the output *is* the weights.

Seed 000: "Todos los pesos son positivos. Suman exactamente 1. El orden se conserva."
The probe is exact: each output entry is sum_l w_il * I_lj = w_ij, products with 0 and 1
add no rounding, so what we read is the backend's own weight matrix in its dtype.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from attnspec.specs import error_budget, invariants

from attnspec.properties.judge import (draw_case, expected_forward, fail_unless, output_tolerance, plain_output, reduction_length,
                    score_size)
from attnspec.properties.seeds import with_seed_examples


def _probe(target, data):
    """(case with V = I, backend weights, reference Forward, plain weights)."""
    case = draw_case(data, target, probe=True).with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    return case, weights, expected_forward(case), plain_output(case, target.budget_dtype)


@with_seed_examples
@given(data=st.data())
def test_weights_nonnegative(target, data):
    case, weights, ref, _ = _probe(target, data)
    verdict = invariants.weights_nonnegative(weights, ref.visible)  # exact: exp is never negative
    fail_unless(verdict, "weights_nonnegative", target, case,
                checks=("print(out.min())  # the weights (V = identity): none may be negative",))


@with_seed_examples
@given(data=st.data())
def test_rows_sum_to_one(target, data):
    case, weights, ref, plain = _probe(target, data)
    rows = ref.visible.any(axis=-1)  # (B, H, Lq) rows the spec judges
    # the row sum is a computed quantity like any other: 2 x the plain dtype's error + floor,
    # its terms (the weights) summing to 1
    atol = error_budget.allowed_error(np.ones(int(rows.sum())), plain.sum(axis=-1, dtype=np.float64)[rows],
                                      target.budget_dtype, reduction_length(case), magnitude=1.0,
                                      score_size=score_size(case))
    verdict = invariants.rows_sum_to_one(weights, ref.visible, atol)
    fail_unless(verdict, "rows_sum_to_one", target, case,
                checks=("print(out.sum(axis=-1))  # each row with a visible key must sum to 1",))


@with_seed_examples
@given(data=st.data())
def test_order_preserved(target, data):
    case, weights, ref, plain = _probe(target, data)
    # a weight may be off by the budget, so a near-tie may flip by that much and no more
    atol = output_tolerance(case, target.budget_dtype)
    verdict = invariants.order_preserved(ref.scores, weights, ref.visible, atol)
    fail_unless(verdict, "order_preserved", target, case,
                checks=("scores = (q @ np.swapaxes(k, -1, -2)) * (scale or q.shape[-1] ** -0.5)",
                        "print(scores, out)  # a higher score must never get a lower weight"))
