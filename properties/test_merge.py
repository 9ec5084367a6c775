"""Family: a backend's merge entry point - two attention states over disjoint keys merged through
their LSEs (FlashInfer's merge_state, vLLM's merge_attn_states, FA3's flash_attn_combine for a list).

Backends offering `Backend.native_merge` are checked against `specs.reference.merge` on drawn states:
empty ones (LSE -inf; +inf where the backend declares `empty_lse = "+inf"`, FA2's, which vLLM's
merge maps to -inf), huge gaps (1e4: one state's weight underflows), each within
`specs.merge_budget`; the merge regrouped and permuted (commutative and associative, FlashInfer's
recursive attention) within both groupings' budgets; two empty states exactly (0, -inf)
(flashinfer#4051 gave NaN).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import require, verdict, worst
from attnspec.specs import reference
from attnspec.specs.error_budget import round_to
from attnspec.specs.fp8 import is_fp8
from attnspec.specs.merge_budget import merge_allowed

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

GAPS = (0.0, 30.0, 1e4)  # spread of the states' LSEs: alike, far (weights ~e^-30), underflowing
EMPTY = (0.0, 0.3, 1.0)  # share of empty states
_SMALL = cases(kinds=("none",), regimes=("small",))  # the problem only sizes the states


def _offered(target: Target) -> None:
    import pytest
    if not target.backend.offers_merge():
        pytest.skip(f"{target.name} offers no merge (Backend.native_merge)")
    if is_fp8(target.dtype):  # states are outputs: in the output's dtype, judged at the float dtypes
        pytest.skip("merge states are attention outputs, not fp8 inputs: the merge is judged at the float dtypes")


def _states(draw, case: Case, target: Target) -> dict:
    """Three states shaped like the case's output, exact in the dtype; LSEs exact in float32."""
    B, H, Lq, Ev = case.q.shape[:-1] + case.v.shape[-1:]
    seed = draw(st.integers(0, 2**16), label="states seed")
    gap, empty = draw(st.sampled_from(GAPS), label="LSE gap"), draw(st.sampled_from(EMPTY), label="empty share")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        o = np.asarray(round_to(rng.standard_normal((B, H, Lq, Ev)), target.dtype), dtype=np.float64)
        lse = rng.standard_normal((B, H, Lq)) * 3 + rng.integers(-1, 2, (B, H, Lq)) * gap  # (B, H, Lq)
        lse = np.where(rng.random((B, H, Lq)) < empty, -np.inf, np.float32(lse).astype(np.float64))
        out.append((np.where(np.isfinite(lse)[..., None], o, 0.0), lse))  # an empty state holds zeros
    return {"states": out}


def _as_given(target: Target, lse):
    """An empty state in the backend's declared convention: +inf where it declares FA2's."""
    return np.where(lse == -np.inf, np.inf, lse) if target.backend.semantics.empty_lse == "+inf" else lse


def _merge(target: Target, a, b):
    o, lse = target.call_backend("merge", target.backend.merge, a[0], _as_given(target, a[1]), b[0],
                                 _as_given(target, b[1]), target.dtype)
    empty_given = np.inf if target.backend.semantics.empty_lse == "+inf" else -np.inf
    return o, np.where(lse == empty_given, -np.inf, lse)  # (B, H, Lq, Ev), (B, H, Lq): empty as -inf


def _judge(name: str, target: Target, got, parts, what: str, times: int = 1) -> None:
    """got (o, lse) against the reference merge of parts within `times` merges' budgets; rows where every
    part is empty exactly (0, -inf)."""
    want_o, want_lse = reference.merge(parts)  # (B, H, Lq, Ev), (B, H, Lq)
    o_tol, lse_tol = merge_allowed(parts, target.budget_dtype)
    empty = np.isneginf(want_lse)  # (B, H, Lq)
    bad_empty = empty & (np.any(got[0] != 0, axis=-1) | (got[1] != -np.inf))
    where, _ = worst(bad_empty.astype(float), bad_empty)
    require(verdict(name, not bad_empty.any(), where, float("nan"),
                    f"{what}: row {where} (batch, head, query) merges only empty states, so must be exactly "
                    f"(0, -inf); got lse {got[1][where] if where is not None else ''!r}", 0.0))
    with np.errstate(invalid="ignore"):
        excess = np.where(empty[..., None], 0.0, np.abs(got[0] - want_o) - times * o_tol)  # (B, H, Lq, Ev)
        lse_excess = np.where(empty, 0.0, np.abs(got[1] - want_lse) - times * lse_tol)  # (B, H, Lq)
    excess, lse_excess = np.nan_to_num(excess, nan=np.inf), np.nan_to_num(lse_excess, nan=np.inf)
    where, amount = worst(excess, ~empty[..., None] & np.ones_like(excess, dtype=bool))
    require(verdict(name, amount <= 0, where, amount,
                    f"{what}: merged output at {where} (batch, head, query, column) is {amount:.6g} past its budget "
                    "(specs.merge_budget)", 0.0))
    where, amount = worst(lse_excess, ~empty)
    require(verdict(name, amount <= 0, where, amount,
                    f"{what}: merged LSE at {where} (batch, head, query) is {amount:.6g} past its budget", 0.0))


@prop(draw=_SMALL, params=_states)
def test_merge_matches_reference(target: Target, case: Case, params: dict):
    """merge(a, b) equals specs.reference.merge([a, b]) within the merge's budget; empty pairs (0, -inf)."""
    _offered(target)
    a, b, _ = params["states"]
    _judge("merge_matches_reference", target, _merge(target, a, b), [a, b], "merge(a, b)")


@prop(draw=_SMALL, params=_states)
def test_merge_regrouped_and_permuted(target: Target, case: Case, params: dict):
    """merge(merge(a, b), c), merge(a, merge(b, c)) and merge(merge(c, a), b): each the reference merge of
    the three within two merges' budgets (so the groupings agree within both)."""
    _offered(target)
    a, b, c = params["states"]
    for what, got in (("merge(merge(a, b), c)", lambda: _merge(target, _merge(target, a, b), c)),
                      ("merge(a, merge(b, c))", lambda: _merge(target, a, _merge(target, b, c))),
                      ("merge(merge(c, a), b)", lambda: _merge(target, _merge(target, c, a), b))):
        _judge("merge_regrouped_and_permuted", target, got(), [a, b, c], what, times=2)


def _two_empty(target: Target):
    from attnspec.properties.case import Case as C
    z = np.zeros((1, 2, 3, 4))  # (B, H, Lq, E): only the shapes matter
    return [(C(z, z, z), {"states": [(z.copy(), np.full((1, 2, 3), -np.inf))] * 3})]


@prop(grid=_two_empty)
def test_merge_of_empty_states(target: Target, case: Case, params: dict):
    """Two empty states merge to exactly (0, -inf): no exp(-inf - -inf) = NaN (flashinfer#4051)."""
    _offered(target)
    a, b, _ = params["states"]
    _judge("merge_of_empty_states", target, _merge(target, a, b), [a, b], "merge of two empty states")
