"""Family: masks — hidden pairs get exactly zero weight, and the future changes nothing.

Seed 000: "la masa sobre el futuro es exactamente 0"; seed 003: "la máscara causal pone a cero
las contribuciones futuras".  Causal alignment follows the backend's declaration (top-left,
the spec's, when it declares none).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs import invariants
from attnspec.specs.invariants import Verdict

from attnspec.properties.judge import draw_case, fail_unless, judged_rows, worst
from attnspec.properties.reuse import integers
from attnspec.properties.strategies import Case


def _needs(target, capability: str) -> None:
    if not getattr(target.caps, capability):
        pytest.skip(f"{target.name} declares no {'causal mode' if capability == 'causal' else 'boolean masks'}")


def _weights(target, data, kinds):
    case = draw_case(data, target, kinds=kinds, probe=True).with_identity_values()
    rows = judged_rows(case)  # (B, H, Lq)
    weights = target.forward(case)  # (B, H, Lq, Lk)
    return case, np.where(rows[..., None], weights, 0.0), rows  # unjudged rows left out


@given(data=st.data())
def test_zero_future_mass(target, data):
    _needs(target, "causal")
    case, weights, _ = _weights(target, data, ("causal", "causal_mask"))
    verdict = invariants.zero_future_mass(weights, case.alignment)
    fail_unless(verdict, "zero_future_mass", target, case,
                checks=("print(out)  # V = identity: the weights; keys after the query must get exactly 0",))


@given(data=st.data())
def test_masked_keys_get_zero_weight(target, data):
    _needs(target, "masks")
    case, weights, rows = _weights(target, data, ("mask", "empty_rows", "causal_mask"))
    hidden = ~case.visible() & rows[..., None]  # (B, H, Lq, Lk) judged hidden pairs
    where, amount = worst(np.abs(weights), hidden)
    verdict = Verdict("masked_keys_get_zero_weight", amount == 0.0, where if amount else None, amount,
                      f"weight {amount:.6g} on the hidden pair {where} (batch, head, query, key): must be exactly 0")
    fail_unless(verdict, "masked_keys_get_zero_weight", target, case,
                checks=("rows = visible.any(axis=-1, keepdims=True)  # rows with a visible key are judged",
                        "print(out[~visible & rows])  # V = identity: the weights of hidden pairs must be exactly 0"))


@given(data=st.data())
def test_future_changes_nothing(target, data):
    """Rows that cannot see keys >= t are bit-for-bit unchanged when those keys and values change."""
    _needs(target, "causal")
    case = draw_case(data, target, kinds=("causal", "causal_mask"))
    d = case.dims
    assume(d["Lk"] >= 2)
    t = data.draw(integers(1, d["Lk"] - 1), label="first changed key") if not isinstance(data, Case) else 1
    before = target.forward(case)  # (B, H, Lq, Ev)
    changed = case.then(f"k[..., {t}:, :] = -2 * k[..., {t}:, :] + 1  # keys and values from {t} on change",
                        f"v[..., {t}:, :] = 3 * v[..., {t}:, :] - 1")
    after = target.forward(changed)  # (B, H, Lq, Ev)
    blind = ~case.visible()[..., t:].any(axis=-1) & judged_rows(case)  # (B, H, Lq)
    where, amount = worst(np.abs(after - before), np.broadcast_to(blind[..., None], after.shape))
    verdict = Verdict("future_changes_nothing", amount == 0.0, where if amount else None, amount,
                      f"output row {where[:-1]} sees no key >= {t}, yet changed by {amount:.6g} when they did")
    fail_unless(verdict, "future_changes_nothing", target, case,
                checks=(f"k2, v2 = k.copy(), v.copy(); k2[..., {t}:, :] = -2 * k2[..., {t}:, :] + 1; "
                        f"v2[..., {t}:, :] = 3 * v2[..., {t}:, :] - 1",
                        f"out2 = backend.forward(q, k2, v2, dtype={target.dtype!r}, **call_kwargs)",
                        f"print(out2 - out)  # rows that see no key >= {t} must not change at all"))
