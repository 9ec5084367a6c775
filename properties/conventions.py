"""The conventions kernels differ on (issue 31), as observed: the LSE's base and what a backend's calls
repeat.  Shared by properties/test_conventions.py (the questions) and `Target` (which reads an LSE in
the base observed when none is declared, so the LSE properties judge the values, not the base).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.case import Case
from attnspec.specs import error_budget

if TYPE_CHECKING:
    from attnspec.properties.target import Target

LN2 = float(np.log(2.0))


def probe(target: Target, shape=(1, 2, 3, 4), seed=0) -> Case:
    """q, k, v on a grid of k/8 (exact in every format), q doubled so no row's LSE is near 0 (where
    the bases agree); E = Ev = 4 or the backend's head-dim multiple."""
    rng = np.random.default_rng(seed)
    B, H, Lq, Lk = shape
    m = target.caps.head_dim_multiple
    E = -(-4 // m) * m
    q = np.round(rng.standard_normal((B, H, Lq, E)) * 8) / 4  # (B, H, Lq, E)
    k = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8  # (B, H, Lk, E)
    v = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8 + 1.0  # (B, H, Lk, Ev)
    return target.exact(Case(q, k, v))


def base_of(target: Target, lse, case: Case) -> str:
    """'e' when the LSE (as the backend returned it) is the natural one within its budget, '2' when it is
    log2-sum-exp2 (FlashInfer), else 'other' - on the rows that see a key (an empty row's is empty_lse's)."""
    rows = case.judged_rows()  # (B, H, Lq)
    for base, natural in (("e", lse), ("2", lse * LN2)):
        if error_budget.check_lse(natural, case.problem, dtype=target.budget_dtype, rows=rows):
            return base
    return "other"


def empty_lse_of(lse_row) -> str:
    """What a row that sees nothing returned as its LSE: -inf, +inf, nan, finite (a fill value) or mixed."""
    kinds = {"-inf" if x == -np.inf else "+inf" if x == np.inf else "nan" if np.isnan(x) else "finite"
             for x in np.ravel(lse_row)}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def observed_lse_base(target: Target) -> str:
    """The base of the returned LSE on the probe, asked once per backend (an undeclared base is read as
    observed; a declared one is the backend's word, converted by `Backend.forward`)."""
    s = target.session
    if s.lse_base is None:
        case = probe(target)
        try:
            _, lse = target.call_backend("forward (LSE base probe)", target.backend.forward, case.q, case.k, case.v,
                                         dtype=target.dtype, return_lse=True)
            s.lse_base = base_of(target, lse, case)
        except Exception:  # noqa: BLE001 - declined or failing: the LSE properties report it
            s.lse_base = "e"
    return s.lse_base


def bitwise(a, b) -> bool:
    """Equal bit for bit, NaN where NaN (the same program on the same numbers)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
