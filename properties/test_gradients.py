"""Family: gradients — dQ, dK, dV against the reference, and the seeds' scaling law.

Seed 003: "el /sqrt(d_k) sobrevive al backward — aparece en dL/dQ y dL/dK".  Problems here
have no fully masked row (every row sees key 0): such a row's gradient is the
implementation's choice, and a NaN there would spread into dK and dV through the sums.
The backward costs ~3 forwards here (reference and plain too): half the examples, and lengths
to 65 (block edges 16, 32, 64 +-1).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from attnspec.properties.distribution import cases
from attnspec.properties.draws import SEEDS
from attnspec.properties.explore import prop
from attnspec.properties.judge import check_gradients, grad_out, require, rule_of
from attnspec.specs import error_budget
from attnspec.specs.invariants import gradient_scaling

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

# whole rows only: bottom-right causal with Lq > Lk, lengths and windows can hide every key of a row
WHOLE_ROWS = cases(allow_empty_rows=False, regimes=("small", "small", "medium"))


def whole_rows(case) -> bool:
    return bool(case.judged_rows().all())


def grad_seed(draw, case: Case, target: Target) -> dict:
    return {"grad_seed": draw(SEEDS, label="grad_out seed")}


@prop(seeds=True, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=grad_seed, seed_params={"grad_seed": 0})
def test_gradients_match_reference(target: Target, case: Case, params: dict):
    check_gradients("gradients_match_reference", target, case, grad_out(case, target.dtype, params["grad_seed"]))


def _scaling(draw, case: Case, target: Target) -> dict:
    log2c = 1 if target.compiled else (1, -1, 2)[draw(st.integers(0, 2), label="log2 c")]
    return {"log2c": log2c, **grad_seed(draw, case, target)}


@prop(seeds=True, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=_scaling,
      seed_params={"log2c": 1, "grad_seed": 0})
def test_gradient_scaling_law(target: Target, case: Case, params: dict):
    """Gradients at (q/c, k/c, scale*c^2) are (c dQ, c dK, dV) at (q, k, scale): same scores, dQ = dS K scale."""
    c = 2.0 ** params["log2c"]  # a power of two: q/c, k/c and scale*c^2 are exact
    g = grad_out(case, target.dtype, params["grad_seed"])
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.dims["E"])
    base = case.replace(scale=scale)
    moved = base.replace(q=base.q / c, k=base.k / c, scale=scale * c * c)
    grads = target.backward(base, g)[:3]  # (dq, dk, dv) at (q, k, scale)
    scaled = target.backward(moved, g)[:3]  # at (q/c, k/c, scale c^2)
    budgets = error_budget.backward_allowed(base.problem, None, None, g, dtype=target.budget_dtype, rule=rule_of(target))
    # each side is within its budget and the moved problem's budget is c times this one's for dQ
    # and dK (same scores; they, their plain errors and magnitudes all scale by c): (c + c) x
    # budget; dV does not scale at all (same weights), so its two budgets are equal: 2 x budget
    tol = tuple(2 * m * budgets[i][0] for i, m in enumerate((c, c, 1.0)))
    require(gradient_scaling(grads, scaled, c, atol=tol))
