"""What one rounding per step can move, row by row: the terms of `specs.error_budget`'s floor.

Every function returns a non-negative array in units of one relative rounding: the floor
multiplies it by sigma = u + sqrt(n) u_acc (specs/error_budget.py derives each term).

Per pair (i, j) of a row, with reference weights w and final scores s:

    T_ij  = R_ij + |bias_ij| + |alibi_ij|   the score's size, R_ij = scale |q_i|.|k_j|; under a
            softcap R_ij (1 - t_ij^2) + (1 + tanh_share) |c_ij|, c = cap t, t = tanh(raw / cap)
    g_ij  = max_l s_il - s_ij                                                   its gap to the row max
    Th_ij = T_ij + g_ij   a kernel's score error is at most sigma * Th_ij: it rounds the score
                          (or q*scale, or the capped, biased score) and s - max before exp

A score error e_j moves the softmax to w_j (1 + e_j - sum_l w_l e_l), so the output moves by
sum_j w_j e_j (v_j - y): that is why the terms below carry |v_j - y| (and |dA_j - rowsum|),
which vanish on saturated rows, instead of |v_j|.  ``tau`` is the format's smallest normal
number: a rounded weight or dS entry errs by u (|x| + tau), since below tau the format spaces
its numbers evenly (subnormals): with it, a row of tiny weights gets its absolute floor.  Where
kernels flush subnormals to zero the entry errs by tau itself: callers pass tau / sigma there.
"""
from __future__ import annotations

import numpy as np

from attnspec.specs.problem import Problem, alibi_bias, visible
from attnspec.specs.reference import dequantized, expand_kv, run_forward, sum_groups, sum_to

_CHUNK = 1 << 16  # elements of the (rows, Lk, Ev) temporary: 512 KB, in cache (4x faster than 16 MB chunks)


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def score_terms(p: Problem, raw=None, tanh_share: float = 0.0) -> np.ndarray:
    """T (..., Lq, Lk): the score's size on visible pairs, 0 elsewhere (``raw``: the reference's
    scale q k^T, if at hand; ``tanh_share``: the tanh's own error, in units of sigma)."""
    dq, dk, _ = dequantized(p)  # fp8 inputs times their descales
    q = np.abs(dq)  # (..., Hq, Lq, E)
    k = expand_kv(np.abs(dk), p.group)  # (..., Hq, Lk, E)
    vis = visible(p)  # (..., Lq, Lk)
    terms = np.broadcast_to((q @ np.swapaxes(k, -1, -2)) * p.scale, vis.shape)  # (..., Lq, Lk) R
    if p.softcap is not None:
        # c = cap tanh(raw / cap) errs by the raw score's error times the slope 1 - t^2, plus the
        # tanh's own error and c's rounding.  Not min(R, cap): a raw score near 0 made of large
        # products (cancellation) keeps all its error through tanh, whose slope is 1 there (jax-naive,
        # float64, cap 4, R ~ 2000: a weight off by 8e-14 relative was failed against cap's floor)
        if raw is None:
            raw = (dq @ np.swapaxes(expand_kv(dk, p.group), -1, -2)) * p.scale
        t = np.tanh(np.broadcast_to(raw, vis.shape) / p.softcap)  # (..., Lq, Lk)
        terms = terms * (1.0 - t * t) + (1.0 + tanh_share) * p.softcap * np.abs(t)
    if p.bias is not None:
        b = np.abs(_f64(p.bias))
        terms = terms + np.where(np.isinf(b), 0.0, b)
    if p.alibi_slopes is not None:
        terms = terms + np.abs(alibi_bias(p.alibi_slopes, p.Lq, p.Lk, p.causal_alignment, p.offsets))
    return np.where(vis, terms, 0.0)


def _top(p: Problem, f) -> np.ndarray:
    """(..., Lq, 1) the row maximum a kernel subtracts: over the visible scores and the sink (gpt-oss's
    Triton kernel starts its running maximum at the sink; a larger maximum, larger gaps)."""
    s = np.where(f.visible, f.scores, -np.inf)  # (..., Lq, Lk)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
    if p.sinks is not None:
        top = np.maximum(top, _f64(p.sinks)[:, None, None])  # (..., Hq, Lq, 1)
    return top


def sink_terms(p: Problem, f) -> tuple:
    """(w_sink, Th_sink) (..., Lq, 1): the sink as a virtual key of value 0 - its weight and its score's
    size |s_h| plus its gap to the row maximum (no scale, cap or bias: s_h is only held and shifted);
    zeros without sinks or where the sink is -inf."""
    if p.sinks is None or f.sink_weight is None:
        return 0.0, 0.0
    s = np.broadcast_to(_f64(p.sinks)[:, None, None], f.lse.shape[:-1] + (f.lse.shape[-1], 1))  # (..., Lq, 1)
    finite = np.isfinite(s)
    th = np.where(finite, np.abs(np.where(finite, s, 0.0)) + np.where(finite, _top(p, f) - np.where(finite, s, 0.0), 0.0),
                  0.0)
    return f.sink_weight[..., None], th  # (..., Lq, 1) twice


def pair_terms(p: Problem, f=None, tanh_share: float = 0.0) -> tuple:
    """(f, Th) with f = run_forward(p) and Th (..., Lq, Lk) = T + gap on visible pairs, 0 elsewhere."""
    f = run_forward(p) if f is None else f
    s = np.where(f.visible, f.scores, -np.inf)  # (..., Lq, Lk)
    top = _top(p, f)  # (..., Lq, 1)
    with np.errstate(invalid="ignore"):
        gap = np.where(f.visible, top - s, 0.0)  # (..., Lq, Lk)
    return f, score_terms(p, f.raw, tanh_share) + gap


def _lse(f, lse_share: float) -> np.ndarray:
    """(..., Lq, 1) lse_share * |lse|, 0 on empty rows: a kernel that writes w = exp(s - lse)
    scales a row's weights by its lse's rounding, lse_share |lse| sigma, with no renormalising."""
    return lse_share * np.where(np.isfinite(f.lse), np.abs(f.lse), 0.0)[..., None]


def forward_terms(p: Problem, f=None, tau: float = 0.0, lse_share: float = 0.0,
                  tanh_share: float = 0.0) -> np.ndarray:
    """(..., Lq, Ev): ((w + tau) |V|)_ic + sum_j w_ij Th_ij |v_jc - y_ic| + lse_share |lse_i| |y_ic|.

    The first term: each weight and the output are rounded (relative errors, not renormalised;
    tau on visible pairs); the second: the score errors, renormalised by the softmax; the third:
    the log-sum-exp's rounding, for kernels that divide by exp(lse) instead of the row sum.
    """
    f, th = pair_terms(p, f, tanh_share)
    av = np.abs(f.v)  # (..., Lk, Ev) expanded to query heads
    out = np.array((f.weights + tau * f.visible) @ av)  # (..., Lq, Ev)
    wt = f.weights * th  # (..., Lq, Lk)
    shape = np.broadcast_shapes(wt.shape[:-2], f.v.shape[:-2], f.output.shape[:-2])
    wt = np.broadcast_to(wt, shape + wt.shape[-2:])
    v = np.broadcast_to(f.v, shape + f.v.shape[-2:])  # (..., Lk, Ev)
    y = np.broadcast_to(f.output, shape + f.output.shape[-2:])  # (..., Lq, Ev)
    ws, ths = sink_terms(p, f)  # the sink's score error, renormalised: w_s e_s (0 - y)
    out = (np.broadcast_to(out, y.shape) + (_lse(f, lse_share) + ws * ths) * np.abs(y)).copy()
    rows = max(1, _CHUNK // max(1, int(np.prod(shape, dtype=np.int64)) * p.Lk * p.Ev))
    buf = np.empty(shape + (min(rows, p.Lq), p.Lk, p.Ev))  # (..., R, Lk, Ev) reused: no allocation a chunk
    for r in range(0, p.Lq, rows):
        spread = buf[..., :min(rows, p.Lq - r), :, :]  # (..., R, Lk, Ev)
        np.abs(np.subtract(v[..., None, :, :], y[..., r:r + rows, None, :], out=spread), out=spread)
        out[..., r:r + rows, :] += (wt[..., r:r + rows, None, :] @ spread)[..., 0, :]  # (..., R, Ev)
    return out


def _underflow(p: Problem, f, b) -> np.ndarray:
    """(..., Lq, Lk) min(w_j, u_p tau_p / l): what rounding P = exp(s - max) below p_dtype's normal range
    loses at most, in weight units (l = exp(lse - max), the row sum P is divided by; 0 on hidden pairs)."""
    top = _top(p, f)  # (..., Lq, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        row_sum = np.exp(np.where(np.isfinite(f.lse), f.lse, 0.0)[..., None] - np.where(np.isfinite(top), top, 0.0))
    return np.minimum(f.weights, b.p_roundoff * b.p_normal_min / np.maximum(row_sum, 1.0))  # (..., Lq, Lk)


def rounding_terms(p: Problem, f, b) -> np.ndarray:
    """(..., Lq, Ev) an fp8 kernel's own roundings (`specs.error_budget`, FP8), absolute: P rounded to
    p_dtype, u_p (w |V|) + sum_j min(w_j, u_p tau_p / l) |v_j|, and the output to its dtype, u_out (|y| + tau_out)."""
    av = np.abs(f.v)  # (..., Hq, Lk, Ev) expanded to query heads
    out = b.out_roundoff * (np.abs(f.output) + b.out_normal_min)  # (..., Lq, Ev)
    if b.p_roundoff:
        out = out + (b.p_roundoff * f.weights + _underflow(p, f, b)) @ av  # (..., Lq, Ev)
    return out


def row_sum_rounding(p: Problem, f, b) -> np.ndarray:
    """(..., Lq) how far those roundings move a row's weights' sum (V = identity: each weight an output)."""
    w = f.weights  # (..., Lq, Lk)
    out = b.out_roundoff * (w.sum(axis=-1) + f.visible.sum(axis=-1) * b.out_normal_min)  # (..., Lq)
    if b.p_roundoff:
        out = out + b.p_roundoff * w.sum(axis=-1) + _underflow(p, f, b).sum(axis=-1)
    return out


def lse_terms(p: Problem, f=None, tanh_share: float = 0.0) -> tuple:
    """(1 + sum_j w_ij Th_ij (..., Lq), |lse| (..., Lq) with 0 on empty rows).

    A score error e_j moves the log-sum-exp by sum_j w_j e_j; the row sum's relative error
    moves it by that error (the 1); its own rounding by u |lse|.
    """
    f, th = pair_terms(p, f, tanh_share)
    size = np.where(np.isfinite(f.lse), np.abs(f.lse), 0.0)  # (..., Lq)
    ws, ths = sink_terms(p, f)  # the sink is one more term of the row sum
    return 1.0 + (f.weights * th).sum(axis=-1) + np.sum(ws * ths, axis=-1), size


# A library's tanh is within a few ulps of tanh, not correctly rounded (measured here: XLA's CPU
# tanh 6 ulps in float64, 4 in float32; NumPy's and PyTorch's 1), and the softcap's derivative
# 1 - t^2 inherits it: an absolute error of 2 |t| TANH_ULPS u_acc beyond its own two roundings
# (jax.grad of cap * tanh(s / cap) in float64: up to 13.8 u against NumPy's 2.0 u).
TANH_ULPS = 8


def backward_terms(p: Problem, grad_out, f=None, tau: float = 0.0, lse_share: float = 0.0,
                   tanh_share: float = 0.0) -> tuple:
    """(dq, dk, dv[, dbias]) terms, each shaped like its gradient.

    dA = dY V^T, r = rowsum(dA w), dS = w (dA - r).  dS_ij's error, in units of sigma:
      (w_ij + tau) (|dY_i|.|V_j| + sum_l w_il |dY_i|.|V_l|) + tau   its terms and itself, rounded
      + w_ij (Th_ij + Thbar_i) |dA_ij - r_i|         the score errors, renormalised
      + w_ij sum_l w_il (Th_il + Thbar_i) |dA_il|    the same errors moving r
      + lse_share |lse_i| |dS_ij|                    P recomputed as exp(S - lse) (flash)
    Under a softcap dS_raw = dS (1 - t^2), t = tanh(raw / cap): the terms times 1 - t^2, plus
    |dS| (2 + 2 |t| tanh_share + 2 |t| (1 - t^2) R / cap) + tau, R = scale |q|.|k|: 1 - t^2 cancels
    (its absolute error is ~2u, and 2 |t| times the tanh's own error: tanh_share = TANH_ULPS
    u_acc in units of sigma) and moves with the raw score's error, and dS_raw's own rounding adds
    tau (below tau the format's spacing is even).  dQ = scale dS K and dK = scale dS^T Q
    carry it, and |dS| once more for the rounding of dS * scale, with |K|, |Q|, plus tau |K| and tau |Q|
    unscaled: a kernel may round dS * scale to the dtype instead of dS (error_budget, step 5);
    dV = w^T dY with (w_ij (1 + Th_ij + Thbar_i + lse_share |lse_i|) + tau) |dY_i|.
    """
    f, th = pair_terms(p, f, tanh_share)
    w = f.weights  # (..., Lq, Lk)
    dy = _f64(grad_out)  # (..., Lq, Ev)
    ady = np.abs(dy)
    ws, ths = sink_terms(p, f)  # the sink's score error renormalises every weight too
    thbar = (w * th).sum(axis=-1, keepdims=True) + ws * ths  # (..., Lq, 1)
    rel = th + thbar  # (..., Lq, Lk) relative error of each weight, renormalised
    terms_da = ady @ np.swapaxes(np.abs(f.v), -1, -2)  # (..., Lq, Lk) |dY_i|.|V_j|
    da = dy @ np.swapaxes(f.v, -1, -2)  # (..., Lq, Lk)
    r = (da * w).sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    moved_r = (w * rel * np.abs(da)).sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    own = (w + tau * f.visible) * (terms_da + (w * terms_da).sum(axis=-1, keepdims=True)) + tau * f.visible
    exact = np.abs(w * (da - r))  # (..., Lq, Lk) |dS|
    lse = _lse(f, lse_share)  # (..., Lq, 1)
    ds = own + w * (rel * np.abs(da - r) + moved_r) + lse * exact  # (..., Lq, Lk)
    dbias = ds  # (..., Lq, Lk) the gradient of the final scores
    if p.softcap is not None:
        t = np.abs(np.tanh(f.raw / p.softcap))  # (..., Lq, Lk)
        raw = (np.abs(f.q) @ np.swapaxes(np.abs(f.k), -1, -2)) * (p.scale / p.softcap)  # (..., Hq, Lq, Lk) R / cap
        # dS_raw is a rounded value of its own: its u (|x| + tau), whose tau part no factor
        # 1 - t^2 shrinks (float16 keeps subnormals: a dS_raw below tau errs by u tau absolutely); and
        # autograd of cap * tanh(s / cap) holds dS * cap before dividing by cap: its tau part, over cap
        # (found: torch-math's float16 dQ at cap 1/64, dS * cap ~ 5e-6 subnormal, 1.9 x over without it)
        ds = ds * (1.0 - t * t) + exact * (2.0 + 2.0 * t * tanh_share + 2.0 * t * (1.0 - t * t) * raw) \
            + tau * (1.0 + 1.0 / p.softcap) * f.visible
    # dS * scale may be rounded to the input dtype before the products (error_budget step 5): its
    # absolute rounding tau reaches dQ and dK times |K| and |Q| unscaled, beside dS's own times scale
    seen = tau * f.visible.astype(np.float64)  # (..., Lq, Lk)
    # dS * scale is a product rounded on its own (autograd through S = (Q K^T) scale, a Triton backward
    # "to reduce register pressure"): its relative error u |dS| reaches dQ and dK beside dS's own rounding
    # (found: torch-math's float16 dK of a key one query sees, 1.07 x over a budget without it)
    ds = ds + exact
    dq = (ds @ np.abs(f.k)) * p.scale + seen @ np.abs(f.k)  # (..., Hq, Lq, E)
    dk = (np.swapaxes(ds, -1, -2) @ np.abs(f.q)) * p.scale + np.swapaxes(seen, -1, -2) @ np.abs(f.q)  # (..., Hq, Lk, E)
    dv = np.swapaxes(w * (1.0 + rel + lse) + tau * f.visible, -1, -2) @ ady  # (..., Hq, Lk, Ev)
    out = [sum_to(dq, np.shape(p.query)), sum_to(sum_groups(dk, p.group), np.shape(p.key)),
           sum_to(sum_groups(dv, p.group), np.shape(p.value))]
    if p.bias is not None:
        out.append(sum_to(dbias, np.shape(p.bias)))
    return tuple(out)
