"""Family: masks — hidden pairs get exactly zero weight, and the future changes nothing.

Seed 000: "la masa sobre el futuro es exactamente 0"; seed 003: "la máscara causal pone a cero
las contribuciones futuras".  Causal alignment follows the backend's declaration (top-left,
the spec's, when it declares none).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties.distribution import Cases, cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import require, unchanged, zero_weights
from attnspec.specs import invariants

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_CAUSAL = ("causal", "causal_mask")


def _weights(target: Target, case: Case):
    """(case with V = I, the backend's weights with unjudged rows zeroed, the judged rows)."""
    case = case.with_identity_values()
    rows = case.judged_rows()  # (B, H, Lq)
    return case, np.where(rows[..., None], target.forward(case), 0.0), rows  # (B, H, Lq, Lk)


@prop(needs=("causal",), draw=cases(kinds=_CAUSAL, probe=True))
def test_zero_future_mass(target: Target, case: Case, params: dict):
    case, weights, _ = _weights(target, case)
    require(invariants.zero_future_mass(weights, case.alignment))


def _hidden_keys(target: Target) -> Cases:
    """Problems with hidden keys: a boolean mask, or the same hidden pairs as a -inf bias for a backend
    that takes a bias and no mask (draws.as_bias); skipped for one that takes neither."""
    if not (target.caps.masks or target.supports("bias")):
        import pytest
        pytest.skip(f"{target.name} takes neither a boolean mask nor a bias: no hidden keys to draw")
    return cases(kinds=("mask", "empty_rows", "causal_mask") if target.caps.causal else ("mask", "empty_rows"),
                 probe=True)


@prop(draw=_hidden_keys)
def test_masked_keys_get_zero_weight(target: Target, case: Case, params: dict):
    case, weights, rows = _weights(target, case)
    zero_weights("masked_keys_get_zero_weight", weights, ~case.visible() & rows[..., None], "masked key")


def _first_changed(draw, case: Case, target: Target) -> dict:
    return {"t": draw(st.integers(1, case.dims["Lk"] - 1), label="first changed key")}


@prop(needs=("causal",), draw=cases(kinds=_CAUSAL), keep=lambda c: c.dims["Lk"] >= 2, params=_first_changed,
      seed_params={"t": 1})
def test_future_changes_nothing(target: Target, case: Case, params: dict):
    """Rows that cannot see keys >= t are bit-for-bit unchanged when those keys and values change."""
    t = params["t"]
    before = target.forward(case)  # (B, H, Lq, Ev)
    k, v = case.k.copy(), case.v.copy()
    k[..., t:, :], v[..., t:, :] = -2 * k[..., t:, :] + 1, 3 * v[..., t:, :] - 1  # keys and values from t on change
    after = target.forward(target.exact(case.replace(k=k, v=v)))  # (B, H, Lq, Ev) fp8: rounded, saturated
    blind = ~case.visible()[..., t:].any(axis=-1) & case.judged_rows()  # (B, H, Lq) rows that see no key >= t
    unchanged("future_changes_nothing", before, after, blind, f"keys and values from {t} on changed; a row that sees "
              f"none of them")
