"""Family: the attention weights, probed with V = identity (Ev = Lk): the output *is* the weights.

Seed 000: "Todos los pesos son positivos. Suman exactamente 1. El orden se conserva."
The probe is exact: each output entry is sum_l w_il * I_lj = w_ij, products with 0 and 1
add no rounding, so what we read is the backend's own weight matrix in its dtype.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import expected, output_tolerance, plain_output, reduction_length, require, rule_of, score_size
from attnspec.specs import error_budget, invariants

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_PROBE = cases(probe=True)  # V = identity: Ev = Lk, a head dim too


@prop(seeds=True, draw=_PROBE)
def test_weights_nonnegative(target: Target, case: Case, params: dict):
    case = case.with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    require(invariants.weights_nonnegative(weights, case.visible()))  # exact: exp is never negative


@prop(seeds=True, draw=_PROBE)
def test_rows_sum_to_one(target: Target, case: Case, params: dict):
    case = case.with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    rows = case.judged_rows()  # (B, H, Lq) rows the spec judges
    # the row sum is a computed quantity like any other: 2 x the plain dtype's error + floor, its
    # terms (the weights) summing to 1
    sums = plain_output(case, target).sum(axis=-1, dtype=np.float64)[rows]
    atol = error_budget.allowed_error(np.ones(int(rows.sum())), sums, target.budget_dtype, reduction_length(case),
                                      magnitude=1.0, score_size=score_size(case), rule=rule_of(target))
    # fp8: P rounded before P V and the output rounding move each weight on their own (0 otherwise)
    atol += float(np.max(error_budget.weight_sum_rounding(case.problem, dtype=target.budget_dtype)[rows], initial=0.0))
    require(invariants.rows_sum_to_one(weights, case.visible(), atol))


@prop(seeds=True, draw=_PROBE)
def test_order_preserved(target: Target, case: Case, params: dict):
    case = case.with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    # a weight may be off by the budget, so a near-tie may flip by that much and no more
    require(invariants.order_preserved(expected(case).scores, weights, case.visible(), output_tolerance(case, target)))
