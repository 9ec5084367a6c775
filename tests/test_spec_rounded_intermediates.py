"""The error budget models intermediates rounded to the input dtype as kernels round them
(specs/error_budget.py, step 5): dS * scale written in float16 before dK = (dS scale)^T Q."""
import numpy as np
import pytest

from attnspec.specs import error_budget as eb
from attnspec.specs import reference as ref
from tests.broken import witnesses as W


def ds_scale_rounded_backward(p: dict, dtype: str):
    """(dq, dk, dv) of a kernel computing in float32 that rounds dS * scale to dtype before dQ and dK."""
    q, k, v, dy = (np.asarray(eb.round_to(p[n], dtype), dtype=np.float64) for n in ("q", "k", "v", "grad_out"))
    f = ref.forward(q, k, v, p["mask"], p["is_causal"], p["scale"])
    w = f.weights  # (..., Lq, Lk)
    da = dy @ np.swapaxes(v, -1, -2)  # (..., Lq, Lk)
    ds = w * (da - (da * w).sum(axis=-1, keepdims=True))  # (..., Lq, Lk)
    scale = q.shape[-1] ** -0.5 if p["scale"] is None else p["scale"]
    ds_scaled = np.asarray(eb.round_to(ds * scale, dtype), dtype=np.float64)  # the rounding, in dtype
    grads = (ds_scaled @ k, np.swapaxes(ds_scaled, -1, -2) @ q, np.swapaxes(w, -1, -2) @ dy)
    return [np.asarray(eb.round_to(g, dtype), dtype=np.float64) for g in grads], (q, k, v, dy)


def test_a_dk_lost_to_an_underflowed_ds_scale_is_within_the_floor():
    """Issue 29's false alarm: dS * scale = 1.3e-8 rounds to 0 in float16, so dK = 0 where the
    reference is 2.1e-6; the row's floor now carries |q| = 20 times the subnormal step."""
    p = W.ds_scale_underflow()
    (dq, dk, dv), (q, k, v, dy) = ds_scale_rounded_backward(p, "float16")
    exact = ref.backward(q, k, v, dy, p["mask"], p["is_causal"], p["scale"])
    assert np.all(dk[0, 0, 1] == 0) and np.abs(exact[1][0, 0, 1]).max() > 2e-6  # the underflow happened
    verdicts = eb.check_backward((dq, dk, dv), q, k, v, dy, p["mask"], p["is_causal"], p["scale"], "float16")
    assert all(verdicts), [v.message for v in verdicts if not v]
    # the allowance of dK row 1: at least 2 sigma tau sum_i |q_i| (the derivation's term), here 9.6e-6
    (_, _, _), (allowed, _, _), _ = eb.backward_allowed_rows(q, k, v, dy, p["mask"], p["is_causal"], p["scale"],
                                                             "float16")
    b = eb.BUDGETS["float16"]
    assert allowed[0, 0, 1] >= b.floor_ulps * b.unit_roundoff * b.normal_min * np.abs(q[0, 0, :, 0]).sum()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("seed", range(3))
def test_rounding_ds_scale_is_accepted_on_spread_scores(dtype, seed):
    """Random problems whose scores spread wide (weights down to 1e-9, so dS * scale underflows in
    float16 for many pairs), large queries, E = 64: the rounded kernel stays within the budget."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 2, 12, 64)) * 6.0  # (B, H, Lq, E)
    k = rng.standard_normal((1, 2, 40, 64)) * 0.6  # (B, H, Lk, E)
    v = rng.standard_normal((1, 2, 40, 16))  # (B, H, Lk, Ev)
    p = dict(q=q, k=k, v=v, mask=None, is_causal=bool(seed % 2), scale=None,
             grad_out=rng.standard_normal((1, 2, 12, 16)))
    grads, (q, k, v, dy) = ds_scale_rounded_backward(p, dtype)
    verdicts = eb.check_backward(grads, q, k, v, dy, None, p["is_causal"], None, dtype)
    assert all(verdicts), [v.message for v in verdicts if not v]
