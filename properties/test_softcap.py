"""Family: softcap — s' = cap * tanh(s / cap) on the scaled scores, before bias and masking.

flash-attention's order (gemm, softcap, mask, softmax; masking first leaks masked keys,
flash-attention#1025); the gradient carries the factor 1 - tanh^2(s / cap).  Bugs this
catches: a dropped cap (sgl-project/sglang#33915), the cap applied after masking, a wrong dQ
(flash-attention#2544).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, check_gradients, grad_out, output_tolerance, require, verdict
from attnspec.properties.test_gradients import WHOLE_ROWS, grad_seed, whole_rows

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_SOFTCAP = ("softcap",)
CAPS = (0.5, 1.0, 2.0)


def _cap(draw, case: Case, target: Target) -> dict:
    return {"cap": CAPS[draw(st.integers(0, len(CAPS) - 1), label="cap")]}


@prop(requires=_SOFTCAP, draw=cases(avoid=frozenset({"bias", "alibi"}), probe=True), params=_cap)
def test_capped_scores_bounded(target: Target, case: Case, params: dict):
    """V = identity, cap <= 2: two visible weights of a row are within exp(2 cap) of each other."""
    cap = params["cap"]
    case = case.replace(softcap=cap).with_identity_values()  # capped scores lie in (-cap, cap)
    weights = target.forward(case)  # (B, H, Lq, Lk)
    vis, rows = case.visible(), case.judged_rows()  # (B, H, Lq, Lk), (B, H, Lq)
    hi = np.where(vis, weights, -np.inf).max(axis=-1, initial=-np.inf)  # (B, H, Lq)
    lo = np.where(vis, weights, np.inf).min(axis=-1, initial=np.inf)  # (B, H, Lq)
    # each weight is within the budget of its exact value, and exact ratios are <= exp(2 cap)
    atol = output_tolerance(case, target)
    excess = np.where(rows, hi - math.exp(2 * cap) * (lo + atol) - atol, -np.inf)  # (B, H, Lq) > 0: too far apart
    excess = np.where(np.isnan(excess), np.inf, excess)
    if excess.size and (excess > 0).any():
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
        require(verdict("capped_scores_bounded", False, where, float(excess[where]),
                        f"softcap {cap}: in row {where} (batch, head, query) the largest weight {hi[where]:.6g} exceeds "
                        f"exp(2 cap) = {math.exp(2 * cap):.4g} x the smallest {lo[where]:.6g}: the scores were not "
                        "capped", 0.0))
    agreement(target, case, weights)


@prop(requires=_SOFTCAP, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=grad_seed)
def test_softcap_gradient_matches_reference(target: Target, case: Case, params: dict):
    """dQ and dK carry 1 - tanh^2(s / cap); dV does not."""
    check_gradients("softcap_gradient_matches_reference", target, case, grad_out(case, target.dtype, params["grad_seed"]))
