"""The error budget of merging attention states through their LSEs (a merge entry point: FlashInfer's
merge_state, vLLM's merge_attn_states, FA3's flash_attn_combine), per row.

A merge of states (o_c, l_c) computes L = m + log sum_c exp(l_c - m) (m the largest l_c) and
O = sum_c exp(l_c - L) o_c, in the computing format (u_c: float32 for 16-bit and float32 states,
float64 for float64), then rounds O to the dtype (u).  The weights' exponents are differences of
numbers as large as |L|, so each carries u_c |L| absolutely (the state's own LSE rounding, and L's:
a kernel may subtract L, not m); the exp, the log and the division add a few u_c each, and each of the
two sums over the C states (the denominator, the weighted outputs) C - 1 more (a list merge, FA3's
flash_attn_combine, sums its splits in one loop).  Hence, with P = sum_c exp(l_c - L) max|o_c| (the
merged row's magnitude, exact):

    |L - L_ref| <= f u_c (|L_ref| + 6 + C)        |O - O_ref| <= f (u_c (2 |L_ref| + 12 + 2 C) + u) P + tau

(for a pair, C = 2: |L_ref| + 8 and 2 |L_ref| + 16).

f the dtype's factor (specs.error_budget.Budget.factor); tau its smallest normal (a flushed weight).
Rows where every state is empty (l_c = -inf) have none: exactly (0, -inf) (flashinfer#4051 gave NaN).
"""
from __future__ import annotations

import numpy as np

from attnspec.specs.error_budget import BUDGETS


def merge_allowed(parts, dtype: str) -> tuple:
    """(out allowed (..., Lq, 1), lse allowed (..., Lq)) for merging [(o_c, l_c)] computed in `dtype`;
    o_c (..., Lq, Ev), l_c (..., Lq) natural, -inf for an empty state; one state or more."""
    if dtype not in BUDGETS:
        raise ValueError(f"dtype must be one of {', '.join(BUDGETS)}; got {dtype!r}")
    if not len(parts):
        raise ValueError("parts: at least one (output, lse) state to merge; got none")
    b = BUDGETS[dtype]
    lses = np.stack([np.asarray(lse, dtype=np.float64) for _, lse in parts])  # (C, ..., Lq)
    top = np.max(lses, axis=0)  # (..., Lq)
    shift = np.where(np.isfinite(top), top, 0.0)
    total = np.exp(lses - shift).sum(axis=0)  # (..., Lq)
    with np.errstate(divide="ignore"):
        big = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1.0)), -np.inf)  # (..., Lq) L_ref
    lref = np.where(np.isfinite(big), np.abs(big), 0.0)  # (..., Lq)
    size = sum(np.exp(np.where(np.isfinite(lse), lse - np.where(np.isfinite(big), big, 0.0), -np.inf))
               * np.max(np.abs(np.asarray(o, dtype=np.float64)), axis=-1, initial=0.0)
               for o, lse in parts)  # (..., Lq): P
    uc, count = b.accumulate_roundoff, len(lses)
    out = b.factor * (uc * (2 * lref + 12 + 2 * count) + b.unit_roundoff) * size + b.normal_min  # (..., Lq)
    return out[..., None], b.factor * uc * (lref + 6 + count)
