"""Family: the additive bias — added to the *scaled* scores, never scaled itself; -inf hides a key.

PyTorch's float attn_mask and JAX's ``bias=`` are this.  Bugs this catches: the bias scaled
with the scores (tenstorrent/tt-metal#42891), a float mask read as a boolean one, a finite
stand-in for -inf that leaks (pytorch/pytorch#110213), dBias wrong or missing.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs import error_budget

from attnspec.properties.judge import agreement, close_outputs, draw_case, fail_unless, judged_rows, requires
from attnspec.properties.reuse import integers
from attnspec.properties.test_gradients import _EXAMPLES, _grad_out

_BIAS = frozenset({"bias"})


@given(data=st.data())
def test_additive_bias_matches_reference(target, data):
    """softmax(scale * q k^T + bias) v: the bias is added after the scale, not scaled."""
    requires(target, "bias")
    case = draw_case(data, target, need=_BIAS, scales=(0.125, 0.25, 2.0, 4.0))  # a scale != 1 shows a scaled bias
    agreement(target, case, "additive_bias_matches_reference")


@given(data=st.data())
def test_additive_bias_row_constant_changes_nothing(target, data):
    """The softmax is shift-invariant per row: bias + c_i (one constant per query row) changes nothing."""
    requires(target, "bias")
    case = draw_case(data, target, need=_BIAS)
    d = case.dims
    seed = data.draw(integers(0, 2**31 - 1), label="row constants seed")
    shifted = case.then(f"bias = np.broadcast_to(fields['bias'], ({d['B']}, {d['H']}, {d['Lq']}, {d['Lk']})) + "
                        f"np.random.default_rng({seed}).integers(-8, 9, ({d['B']}, {d['H']}, {d['Lq']}, 1)) / 4"
                        "  # plus a constant per row, exact in every format",
                        "fields = dict(fields, bias=bias)")
    before, after = target.forward(case), target.forward(shifted)  # (B, H, Lq, Ev) twice
    close_outputs("additive_bias_row_constant_changes_nothing", target, case, before, after, shifted,
                  "a per-row constant added to the bias", checks=(
                      f"c = np.random.default_rng({seed}).integers(-8, 9, ({d['B']}, {d['H']}, {d['Lq']}, 1)) / 4",
                      f"out2 = backend.forward(q, k, v, dtype={target.dtype!r}, **dict(call_kwargs, bias=fields['bias'] + c))",
                      "print(np.abs(out2 - out).max())  # must be ~0: the softmax ignores a per-row shift"))


@given(data=st.data())
def test_neg_inf_bias_equals_boolean_mask(target, data):
    """A bias of 0 where a boolean mask is True and -inf where it is False is the same problem."""
    requires(target, "bias")
    if not target.caps.masks:
        pytest.skip(f"{target.name} takes no boolean mask")
    case = draw_case(data, target, kinds=("mask", "empty_rows"), avoid=_BIAS)
    as_bias = case.then("fields = dict(fields, bias=np.where(mask, 0.0, -np.inf))  # the mask as a bias",
                        "mask = None")
    masked, biased = target.forward(case), target.forward(as_bias)  # (B, H, Lq, Ev) twice
    close_outputs("neg_inf_bias_equals_boolean_mask", target, case, masked, biased, as_bias,
                  "boolean mask vs the same mask as a 0/-inf bias", checks=(
                      "kw = dict(call_kwargs, mask=None, bias=np.where(mask, 0.0, -np.inf))",
                      f"out2 = backend.forward(q, k, v, dtype={target.dtype!r}, **kw)",
                      "print(np.abs(out2 - out)[visible.any(-1)].max())  # must be ~0"))


@pytest.mark.needs_gradients
@_EXAMPLES
@given(data=st.data())
def test_bias_gradient_matches_reference(target, data):
    """dQ, dK, dV with a bias, and dBias = dS summed to the bias's shape (when the backend returns it)."""
    requires(target, "bias")
    case = draw_case(data, target, need=_BIAS, allow_empty_rows=False, regimes=("small", "small", "medium"))
    assume(judged_rows(case).all())
    g, line = _grad_out(data, case, target.dtype)
    got = target.backward(case, g, grad_line=line)  # (dq, dk, dv[, dbias])
    # (a backend declaring bias_gradient that returns no dBias fails in Backend.backward already)
    verdicts = error_budget.check_backward(got, case.problem, None, None, g, dtype=target.budget_dtype)
    for name, verdict in zip(("dq", "dk", "dv", "dbias"), verdicts):
        fail_unless(verdict, "bias_gradient_matches_reference", target, case, call="backward", grad_line=line,
                    checks=(f"print(np.abs(grads[{('dq', 'dk', 'dv', 'dbias').index(name)}] - "
                            f"ref[{('dq', 'dk', 'dv', 'dbias').index(name)}]).max())",))
