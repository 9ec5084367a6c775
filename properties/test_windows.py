"""Family: sliding windows — query i keeps keys j with i + o - left <= j <= i + o + right, inclusive.

o = Lk - Lq when bottom-right aligned, else 0 (`specs.problem.window_mask`).  flash-attention's
``window_size=(wl, wr)`` is this bottom-right aligned (its -1 is None here); JAX's
``local_window_size=(L, R)`` top-left.  Bugs this catches: a window off by one on either side
(vllm-project/vllm#3385, huggingface/transformers#29623), the wrong alignment, a window ignored
on one path (jax-ml/jax#32300).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.specs.invariants import Verdict
from attnspec.specs.problem import window_mask

from attnspec.properties.judge import agreement, close_outputs, draw_case, fail_unless, judged_rows, requires, worst

_WINDOW = frozenset({"window"})


@given(data=st.data())
def test_zero_weight_outside_window(target, data):
    """V = identity: every key outside the window gets exactly zero weight; the rest matches the reference."""
    requires(target, "window")
    case = draw_case(data, target, need=_WINDOW, probe=True).with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    d = case.dims
    outside = ~window_mask(d["Lq"], d["Lk"], case.fields["window"], case.alignment)  # (Lq, Lk)
    judged = np.broadcast_to(outside, weights.shape) & judged_rows(case)[..., None]
    where, amount = worst(np.abs(weights), judged)
    verdict = Verdict("zero_weight_outside_window", amount == 0.0, where if amount else None, amount,
                      f"window {case.fields['window']} ({case.alignment}): weight {amount:.6g} on key {where} "
                      "(batch, head, query, key), outside the window")
    fail_unless(verdict, "zero_weight_outside_window", target, case,
                checks=("print((out != 0).astype(int))  # V = identity: compare with visible.astype(int)",))
    agreement(target, case, "zero_weight_outside_window")


@given(data=st.data())
def test_window_equals_its_mask(target, data):
    """A window is the same problem as the boolean mask that window_mask builds."""
    requires(target, "window")
    if not target.caps.masks:
        pytest.skip(f"{target.name} takes no boolean mask")
    case = draw_case(data, target, need=_WINDOW, kinds=("none", "mask"))
    d = case.dims
    as_mask = case.then(f"mask = (True if mask is None else mask) & window_mask({d['Lq']}, {d['Lk']}, "
                        f"fields['window'], {case.alignment!r})  # the window as a mask",
                        window_mask=window_mask).with_fields("no window", window=None)
    windowed, masked = target.forward(case), target.forward(as_mask)  # (B, H, Lq, Ev) twice
    close_outputs("window_equals_its_mask", target, case, windowed, masked, as_mask,
                  f"window {case.fields['window']} vs the same window as a boolean mask", checks=(
                      "from specs.problem import window_mask",
                      f"m = window_mask({d['Lq']}, {d['Lk']}, fields['window'], {case.alignment!r})",
                      "kw = dict(call_kwargs, mask=m if mask is None else mask & m); kw.pop('window')",
                      f"out2 = backend.forward(q, k, v, dtype={target.dtype!r}, **kw)",
                      "print(np.abs(out2 - out).max())  # must be ~0"))
