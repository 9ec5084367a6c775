"""Family: sliding windows — query i keeps keys j with i + o - left <= j <= i + o + right, inclusive.

o = Lk - Lq when bottom-right aligned, else 0 (`specs.masks.window_mask`).  flash-attention's
``window_size=(wl, wr)`` is this bottom-right aligned (its -1 is None here); JAX's
``local_window_size=(L, R)`` top-left.  Bugs this catches: a window off by one on either side
(vllm-project/vllm#3385, huggingface/transformers#29623), the wrong alignment, a window ignored
on one path (jax-ml/jax#32300).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, close_outputs, zero_weights
from attnspec.specs.masks import window_mask

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_WINDOW = ("window",)


@prop(requires=_WINDOW, draw=cases(probe=True))
def test_zero_weight_outside_window(target: Target, case: Case, params: dict):
    """V = identity: every key outside the window gets exactly zero weight; the rest matches the reference."""
    case = case.with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    d = case.dims
    outside = ~window_mask(d["Lq"], d["Lk"], case.fields["window"], case.alignment)  # (Lq, Lk)
    judged = np.broadcast_to(outside, weights.shape) & case.judged_rows()[..., None]
    zero_weights("zero_weight_outside_window", weights, judged,
                 f"window {case.fields['window']} ({case.alignment}), a key outside it")
    agreement(target, case, weights)


@prop(requires=_WINDOW, needs=("masks",), draw=cases(kinds=("none", "mask")))
def test_window_equals_its_mask(target: Target, case: Case, params: dict):
    """A window is the same problem as the boolean mask that window_mask builds."""
    d = case.dims
    m = window_mask(d["Lq"], d["Lk"], case.fields["window"], case.alignment)  # (Lq, Lk)
    as_mask = case.replace(mask=m if case.mask is None else case.mask & m, window=None)
    close_outputs("window_equals_its_mask", target, case, target.forward(case), target.forward(as_mask), as_mask,
                  f"window {case.fields['window']} vs the same window as a boolean mask")
