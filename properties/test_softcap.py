"""Family: softcap — s' = cap * tanh(s / cap) on the scaled scores, before bias and masking.

flash-attention's order (gemm, softcap, mask, softmax; masking first leaks masked keys,
flash-attention#1025); the gradient carries the factor 1 - tanh^2(s / cap).  Bugs this
catches: a dropped cap (sgl-project/sglang#33915), the cap applied after masking, a wrong dQ
(flash-attention#2544).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs import error_budget
from attnspec.specs.invariants import Verdict

from attnspec.properties.judge import agreement, draw_case, fail_unless, judged_rows, output_tolerance, requires
from attnspec.properties.reuse import sampled
from attnspec.properties.test_gradients import _EXAMPLES, _grad_out

_SOFTCAP = frozenset({"softcap"})


@given(data=st.data())
def test_capped_scores_bounded(target, data):
    """V = identity, cap <= 2: two visible weights of a row are within exp(2 cap) of each other."""
    requires(target, "softcap")
    cap = data.draw(sampled((0.5, 1.0, 2.0)), label="cap")
    case = draw_case(data, target, need=_SOFTCAP, avoid=frozenset({"bias", "alibi"}), probe=True)
    case = case.with_fields(f"cap {cap}: capped scores lie in (-{cap}, {cap})", softcap=cap).with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    vis = case.visible()  # (B, H, Lq, Lk)
    rows = judged_rows(case)
    hi = np.where(vis, weights, -np.inf).max(axis=-1)  # (B, H, Lq)
    lo = np.where(vis, weights, np.inf).min(axis=-1)  # (B, H, Lq)
    # each weight is within the budget of its exact value, and exact ratios are <= exp(2 cap)
    atol = output_tolerance(case, target.budget_dtype)
    excess = np.where(rows, hi - math.exp(2 * cap) * (lo + atol) - atol, -np.inf)  # (B, H, Lq) > 0: too far apart
    excess = np.where(np.isnan(excess), np.inf, excess)
    flat = int(np.argmax(excess)) if excess.size else 0
    where = tuple(int(i) for i in np.unravel_index(flat, excess.shape)) if excess.size else None
    amount = float(excess.flat[flat]) if excess.size else -np.inf
    verdict = Verdict("capped_scores_bounded", amount <= 0, where, amount,
                      f"softcap {cap}: in row {where} (batch, head, query) the largest weight {hi[where]:.6g} exceeds "
                      f"exp(2 cap) = {math.exp(2 * cap):.4g} x the smallest {lo[where]:.6g}: the scores were not capped"
                      if where is not None and amount > 0 else "capped")
    fail_unless(verdict, "capped_scores_bounded", target, case,
                checks=(f"w = np.where(visible, out, np.nan); print(np.nanmax(w, -1) / np.nanmin(w, -1))"
                        f"  # at most exp(2 * {cap})",))
    agreement(target, case, "capped_scores_bounded")


@pytest.mark.needs_gradients
@_EXAMPLES
@given(data=st.data())
def test_softcap_gradient_matches_reference(target, data):
    """dQ and dK carry 1 - tanh^2(s / cap); dV does not."""
    requires(target, "softcap")
    case = draw_case(data, target, need=_SOFTCAP, allow_empty_rows=False, regimes=("small", "small", "medium"))
    assume(judged_rows(case).all())
    g, line = _grad_out(data, case, target.dtype)
    got = target.backward(case, g, grad_line=line)
    verdicts = error_budget.check_backward(got, case.problem, None, None, g, dtype=target.budget_dtype)
    for i, verdict in enumerate(verdicts):
        fail_unless(verdict, "softcap_gradient_matches_reference", target, case, call="backward", grad_line=line,
                    checks=(f"print(np.abs(grads[{i}] - ref[{i}]).max())",))
