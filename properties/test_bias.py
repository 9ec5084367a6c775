"""Family: the additive bias — added to the *scaled* scores, never scaled itself; -inf hides a key.

PyTorch's float attn_mask and JAX's ``bias=`` are this.  Bugs this catches: the bias scaled
with the scores (tenstorrent/tt-metal#42891), a float mask read as a boolean one, a finite
stand-in for -inf that leaks (pytorch/pytorch#110213), dBias wrong or missing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.distribution import cases
from attnspec.properties.draws import SEEDS
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, check_gradients, close_outputs, grad_out
from attnspec.properties.test_gradients import WHOLE_ROWS, grad_seed, whole_rows

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_BIAS = ("bias",)


@prop(requires=_BIAS, draw=cases(scales=(0.125, 0.25, 2.0, 4.0)))  # a scale != 1 shows a scaled bias
def test_additive_bias_matches_reference(target: Target, case: Case, params: dict):
    """softmax(scale * q k^T + bias) v: the bias is added after the scale, not scaled; again with the bias
    brought within +-4 by a power of two (exact), where the drawn one is wider: a bias of hundreds makes
    each row one-hot whether it is scaled or not, so only a moderate one shows a scaled bias."""
    agreement(target, case)
    bias = case.fields.get("bias")
    finite = np.abs(bias[np.isfinite(bias)]) if bias is not None else np.zeros(0)  # like bias, flattened
    if finite.size and finite.max() > 4:
        agreement(target, case.replace(bias=bias * 2.0 ** -np.ceil(np.log2(finite.max() / 4))))


def _row_seed(draw, case: Case, target: Target) -> dict:
    return {"seed": draw(SEEDS, label="row constants seed")}


@prop(requires=_BIAS, params=_row_seed)
def test_additive_bias_row_constant_changes_nothing(target: Target, case: Case, params: dict):
    """The softmax is shift-invariant per row: bias + c_i (one constant per query row) changes nothing."""
    d = case.dims
    rows = (d["B"], d["H"], d["Lq"], 1)
    c = np.random.default_rng(params["seed"]).integers(-8, 9, rows) / 4  # exact in every format
    shifted = case.replace(bias=np.broadcast_to(case.fields["bias"], rows[:3] + (d["Lk"],)) + c)
    close_outputs("additive_bias_row_constant_changes_nothing", target, case, target.forward(case),
                  target.forward(shifted), shifted, "a per-row constant added to the bias")


@prop(requires=_BIAS, needs=("masks",), draw=cases(kinds=("mask", "empty_rows"), avoid=_BIAS))
def test_neg_inf_bias_equals_boolean_mask(target: Target, case: Case, params: dict):
    """A bias of 0 where a boolean mask is True and -inf where it is False is the same problem."""
    as_bias = case.replace(mask=None, bias=np.where(case.mask, 0.0, -np.inf))
    close_outputs("neg_inf_bias_equals_boolean_mask", target, case, target.forward(case), target.forward(as_bias),
                  as_bias, "boolean mask vs the same mask as a 0/-inf bias")


@prop(requires=_BIAS, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=grad_seed)
def test_bias_gradient_matches_reference(target: Target, case: Case, params: dict):
    """dQ, dK, dV with a bias, and dBias = dS summed to the bias's shape (when the backend returns it)."""
    # (a backend declaring bias_gradient that returns no dBias fails in Backend.backward already)
    check_gradients("bias_gradient_matches_reference", target, case, grad_out(case, target.dtype, params["grad_seed"]))
