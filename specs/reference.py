"""The float64 reference: the measuring stick every backend is compared with.

Forward, one pipeline for every field of `specs.problem` (seed 004's steps, grown):

    s   = scale * q k^T            (query head h reads KV head h // group)
    s   = softcap * tanh(s / softcap)
    s  += bias + alibi
    row maximum subtracted ("resta el máximo de la fila (por estabilidad)"), hidden pairs -inf,
    A   = softmax(s) over visible keys,  Y = A V,  lse = log sum_j exp(s_j) over visible keys
    with sinks s_h (query head h): A = exp(s_j) / (sum_visible exp(s_j') + exp(s_h)), lse includes
    exp(s_h); the sink is a virtual key of value 0 that no scale, cap, bias or mask reaches

Quantised inputs (fp8, issue 31) carry descales: every step above runs on the dequantised values
q * q_descale, k * k_descale, v * v_descale (`dequantized`; one descale per batch element and KV head).

Backward (seed 003's chain, plus the fields):

    dV = A^T dY;  dA = dY V^T;  dS = A * (dA - rowsum(dA * A));  dBias = dS (summed to bias's shape)
    dS_raw = dS * (1 - tanh^2(s / softcap)) with a softcap, else dS
    dQ = dS_raw K * scale;  dK = dS_raw^T Q * scale;  dK, dV summed over each query-head group.
    dSink_h = -sum_{b,i} p_sink(b,h,i) (dY_i . Y_i), p_sink = exp(s_h - lse): the sink's column of dS,
    whose dA is 0 (its value is 0) and whose row term rowsum(dA * A) = dY_i . Y_i (`run_dsink`).

The pipeline takes an *arithmetic*: exact float64 here; `specs.error_budget` runs the very same
steps with every intermediate rounded to a dtype (the "plain" computation), so the reference
and the budget's model can never describe two different algorithms.

Fully masked rows (no visible key, padded query rows included) are left to implementations by
the spec.  The reference's choice: weights, output and gradients of such a row are zeros, and
its log-sum-exp is -inf; with a sink, the output of such a row is 0 and its lse is s_h.
Optimized code must never import this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnspec.specs.problem import Problem, alibi_bias, validate, visible


@dataclass(frozen=True)
class Forward:
    problem: Problem
    visible: np.ndarray   # (..., Lq, Lk) bool
    scores: np.ndarray    # (..., Lq, Lk) final scores (scaled, capped, biased), unmasked
    weights: np.ndarray   # (..., Lq, Lk) softmax over visible keys; zeros on empty rows
    output: np.ndarray    # (..., Lq, Ev)
    lse: np.ndarray       # (..., Lq) log-sum-exp of visible scores (and the sink); -inf on empty rows
    sink_weight: np.ndarray | None = None  # (..., Lq) exp(s_h - lse): the sink's share; None without sinks

    @property
    def empty_rows(self) -> np.ndarray:
        return ~self.visible.any(axis=-1)  # (..., Lq)


class Exact:
    """float64 arithmetic, nothing rounded: the reference's."""

    acc = np.float64
    dtype = "float64"

    def r(self, x) -> np.ndarray:  # round to the format: nothing to do
        return np.asarray(x, dtype=np.float64)

    def a(self, x) -> np.ndarray:  # to the accumulator type
        return np.asarray(x, dtype=np.float64)

    def matmul(self, x, y) -> np.ndarray:
        return self.a(x) @ self.a(y)

    def sum(self, x, axis, keepdims=False) -> np.ndarray:
        return self.r(self.a(x).sum(axis=axis, keepdims=keepdims))

    def probabilities(self, e, total) -> np.ndarray:
        """The weights P V takes: exp(s - max) / row sum, rounded (an fp8 kernel rounds exp(s - max)
        itself before the product: `specs.plain.Fp8Plain`)."""
        return self.r(e / total)

    def output(self, x) -> np.ndarray:
        """The output P V as returned (an fp8 kernel rounds it to its output dtype)."""
        return self.r(x)

    def inputs(self, p) -> tuple:
        """(q, k, v) as the arithmetic reads them: dequantised (an fp8 kernel first casts them to fp8)."""
        return dequantized(p)


EXACT = Exact()


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def expand_kv(x: np.ndarray, group: int) -> np.ndarray:
    """(..., Hkv, L, D) -> (..., Hq, L, D): each KV head repeated for its `group` query heads."""
    return x if group == 1 else np.repeat(x, group, axis=-3)


def sum_groups(g: np.ndarray, group: int) -> np.ndarray:
    """(..., Hq, L, D) -> (..., Hkv, L, D): the gradient of `expand_kv`."""
    if group == 1:
        return g
    *lead, Hq, L, D = g.shape
    return g.reshape(*lead, Hq // group, group, L, D).sum(axis=-3)


def sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Undo broadcasting: sum x over the axes that were broadcast to reach x.shape."""
    while x.ndim > len(shape):
        x = x.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


@dataclass(frozen=True)
class _Steps:
    """What the forward computed, kept for the backward."""

    q: np.ndarray         # (..., Hq, Lq, E) inputs as the arithmetic sees them
    k: np.ndarray         # (..., Hq, Lk, E) expanded to query heads
    v: np.ndarray         # (..., Hq, Lk, Ev)
    raw: np.ndarray       # (..., Lq, Lk) scale * q k^T, before the softcap
    scores: np.ndarray    # (..., Lq, Lk) final
    visible: np.ndarray   # (..., Lq, Lk)
    weights: np.ndarray   # (..., Lq, Lk)
    output: np.ndarray    # (..., Lq, Ev)
    lse: np.ndarray       # (..., Lq)
    sink_weight: np.ndarray | None = None  # (..., Lq) the sink's weight; None without sinks


def _descaled(x: np.ndarray, descale, group: int) -> np.ndarray:
    """x (..., H, L, D) times its descale (..., Hkv) broadcast over L and D (over each group of query
    heads when x has Hq = group * Hkv heads); x itself without one."""
    if descale is None:
        return x
    d = np.asarray(descale, dtype=np.float64)
    if d.ndim and group > 1:
        d = np.broadcast_to(d, d.shape[:-1] + (x.shape[-3] // group,))  # (..., Hkv)
        d = np.repeat(d, group, axis=-1)  # (..., Hq): query head h shares KV head h // group's
    return x * d[..., None, None]  # (..., H, L, D): exact (fp8 x float32 fits in float64)


def dequantized(p: Problem) -> tuple:
    """(q, k, v) float64 as the definition reads them: the inputs times their descales (fp8)."""
    return (_descaled(_f64(p.query), p.q_descale, p.group), _descaled(_f64(p.key), p.k_descale, 1),
            _descaled(_f64(p.value), p.v_descale, 1))


def sink_logits(p: Problem, shape: tuple, A=EXACT):
    """(..., Lq, 1) the sink s_h of each row's query head, broadcast to the scores' rows; None without."""
    if p.sinks is None:
        return None
    s = A.a(A.r(_f64(p.sinks)))[:, None, None]  # (Hq, 1, 1): one per query head, the head axis -3
    return np.broadcast_to(s, shape[:-1] + (1,))  # (..., Lq, 1)


def scores_of(p: Problem, A=EXACT, q=None, k=None) -> tuple:
    """(raw, final) scores (..., Lq, Lk): scale q k^T, then softcap, bias and ALiBi."""
    if q is None or k is None:
        dq, dk, _ = A.inputs(p)
        q = A.r(dq) if q is None else q
        k = expand_kv(A.r(dk), p.group) if k is None else k
    raw = A.r(A.a(A.matmul(q, np.swapaxes(k, -1, -2))) * A.acc(p.scale))  # (..., Lq, Lk)
    s = raw
    if p.softcap is not None:
        s = A.r(p.softcap * np.tanh(A.a(s) / p.softcap))  # (..., Lq, Lk) |s| < softcap
    if p.bias is not None:
        b = A.a(A.r(_f64(p.bias)))
        with np.errstate(invalid="ignore"):
            s = A.r(A.a(s) + np.where(np.isneginf(b), 0.0, b))  # -inf entries are hidden by `visible`
    if p.alibi_slopes is not None:
        s = A.r(A.a(s) + A.a(A.r(alibi_bias(p.alibi_slopes, p.Lq, p.Lk, p.causal_alignment, p.offsets))))
    return raw, s


def masked_softmax(s: np.ndarray, vis: np.ndarray, A=EXACT):
    """Row softmax over visible entries; returns (weights, lse). Stable for |s| up to ~1e300."""
    return sink_softmax(s, vis, A)[:2]


def sink_softmax(s: np.ndarray, vis: np.ndarray, A=EXACT, sink=None):
    """`masked_softmax` with ``sink`` (..., Lq, 1) - one more logit in each row's denominator (gpt-oss's
    naive kernel: concatenated as a column, softmax, column dropped); returns (weights, lse, the sink's
    weight (..., Lq) or None)."""
    masked = np.where(vis, A.a(s), -np.inf)  # (..., Lq, Lk)
    if sink is not None:
        masked = np.concatenate([masked, np.broadcast_to(sink, masked.shape[:-1] + (1,))], axis=-1)  # (..., Lq, Lk+1)
    row_max = masked.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
    empty = ~np.isfinite(row_max)  # rows with no visible key (and no sink)
    shift = np.where(empty, 0.0, row_max)  # (..., Lq, 1)
    e = A.a(A.r(np.exp(masked - shift)))  # (..., Lq, Lk[+1]) exp(-inf) = 0 exactly
    total = A.a(A.sum(e[..., :vis.shape[-1]], axis=-1, keepdims=True))  # (..., Lq, 1) the keys' sum
    if sink is not None:  # folded after the keys' sum, one more rounding (FlashInfer; a 16-bit kernel
        total = A.a(A.r(total + e[..., -1:]))  # holding its row sum in the format rounds it twice)
    weights = A.probabilities(e, np.where(empty, 1.0, total))  # (..., Lq, Lk[+1])
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, A.a(A.r(shift + A.a(A.r(np.log(np.where(empty, 1.0, total)))))))[..., 0]
    if sink is None:
        return weights, lse, None  # (..., Lq, Lk), (..., Lq)
    return weights[..., :-1], lse, A.a(weights[..., -1])  # (..., Lq, Lk), (..., Lq), (..., Lq)


def run_forward(p: Problem, A=EXACT) -> _Steps:
    """The forward pipeline on a validated problem in arithmetic A."""
    dq, dk, dv = A.inputs(p)  # the inputs times their descales (fp8), else the inputs
    q = A.r(dq)  # (..., Hq, Lq, E)
    k = expand_kv(A.r(dk), p.group)  # (..., Hq, Lk, E)
    v = expand_kv(A.r(dv), p.group)  # (..., Hq, Lk, Ev)
    raw, s = scores_of(p, A, q, k)  # (..., Lq, Lk) twice
    vis = visible(p)  # (..., Lq, Lk)
    s = np.broadcast_to(s, vis.shape)
    w, lse, ws = sink_softmax(s, vis, A, sink_logits(p, vis.shape, A))  # (..., Lq, Lk), (..., Lq), (..., Lq)
    out = A.output(A.matmul(w, v))  # (..., Lq, Ev): the sink's value is 0
    return _Steps(q, k, v, np.broadcast_to(raw, vis.shape), s, vis, w, out, lse, ws)


def run_backward(p: Problem, grad_out, A=EXACT) -> tuple:
    """(dq, dk, dv) - and dbias when the problem has a bias - each shaped like its input."""
    if "descale" in p.features:
        raise ValueError("descales: the backward of quantised inputs is not defined here (FA3, FA4 and PyTorch's "
                         "quantised SDPA are forward-only); drop q_descale, k_descale and v_descale")
    f = run_forward(p, A)
    dy = A.r(_f64(grad_out))  # (..., Lq, Ev)
    w = A.a(f.weights)  # (..., Lq, Lk)
    dv = A.matmul(np.swapaxes(f.weights, -1, -2), dy)  # (..., Hq, Lk, Ev)
    da = A.a(A.r(A.matmul(dy, np.swapaxes(f.v, -1, -2))))  # (..., Lq, Lk)
    row = A.a(A.sum(da * w, axis=-1, keepdims=True))  # (..., Lq, 1)
    ds = A.r(w * A.a(A.r(da - row)))  # (..., Lq, Lk) d(final scores): the softmax backward
    dbias = ds
    if p.softcap is not None:  # d(cap tanh(x / cap))/dx = 1 - tanh^2(x / cap)
        t = A.a(A.r(np.tanh(A.a(f.raw) / p.softcap)))  # (..., Lq, Lk) held in the format, like the scores
        ds = A.r(A.a(ds) * A.a(A.r(1.0 - t * t)))  # 1 - t^2 cancels where |t| ~ 1: its rounding counts
    dq = A.a(A.matmul(ds, f.k)) * A.acc(p.scale)  # (..., Lq, E)
    dk = A.a(A.matmul(np.swapaxes(ds, -1, -2), f.q)) * A.acc(p.scale)  # (..., Hq, Lk, E)
    grads = [sum_to(dq, np.shape(p.query)), sum_to(sum_groups(dk, p.group), np.shape(p.key)),
             sum_to(sum_groups(A.a(dv), p.group), np.shape(p.value))]
    if p.bias is not None:
        grads.append(sum_to(A.a(dbias), np.shape(p.bias)))
    return tuple(A.r(g) for g in grads)


def run_dsink(p: Problem, grad_out, A=EXACT, f=None) -> np.ndarray:
    """dSink (Hq,) of sum(output * grad_out): the sink's column of dS, p_sink (0 - dY.Y), summed over
    every batch element and query row of its head (the head axis is -3 of the scores, -2 here)."""
    f = run_forward(p, A) if f is None else f
    dy = A.r(_f64(grad_out))  # (..., Hq, Lq, Ev)
    row = A.a(A.sum(A.a(dy) * A.a(f.output), axis=-1))  # (..., Hq, Lq) dY_i . Y_i
    ds = A.r(-A.a(f.sink_weight) * row)  # (..., Hq, Lq)
    ds = ds.reshape(-1, *ds.shape[-2:])  # (batch, Hq, Lq)
    return A.r(A.a(ds).sum(axis=(0, 2)))  # (Hq,)


def _problem(query, key, value, mask, is_causal, scale, fields) -> Problem:
    if isinstance(query, Problem):
        return query
    return validate(query, key, value, mask, is_causal, scale, **fields)


def forward(query, key=None, value=None, mask=None, is_causal=False, scale=None, **fields) -> Forward:
    """The reference forward; `query` may also be a validated `specs.problem.Problem`."""
    p = _problem(query, key, value, mask, is_causal, scale, fields)
    f = run_forward(p)
    return Forward(p, f.visible, f.scores, f.weights, f.output, f.lse, f.sink_weight)


def attention(query, key=None, value=None, mask=None, is_causal=False, scale=None, **fields) -> np.ndarray:
    return forward(query, key, value, mask, is_causal, scale, **fields).output


def backward(query, key, value, grad_out, mask=None, is_causal=False, scale=None, **fields):
    """(dQ, dK, dV) of sum(output * grad_out), each shaped like its input; (dQ, dK, dV, dBias) with a bias."""
    return run_backward(_problem(query, key, value, mask, is_causal, scale, fields), grad_out)


def dsink(query, key, value, grad_out, mask=None, is_causal=False, scale=None, **fields) -> np.ndarray:
    """dSink (Hq,) of sum(output * grad_out) for a problem with sinks."""
    p = _problem(query, key, value, mask, is_causal, scale, fields)
    if p.sinks is None:
        raise ValueError("dsink needs sinks: the problem has none")
    return run_dsink(p, grad_out)


def merge(parts) -> tuple:
    """Attention over key chunks merged through their log-sum-exps: [(out_c, lse_c)] -> (out, lse).

    lse = logsumexp_c(lse_c), out = sum_c exp(lse_c - lse) out_c: what split-KV kernels
    (flash-decoding, ring attention) do.  Chunks where a row sees nothing (lse -inf) add nothing.
    """
    outs = [_f64(o) for o, _ in parts]  # each (..., Lq, Ev)
    lses = np.stack([_f64(lse) for _, lse in parts])  # (C, ..., Lq)
    top = lses.max(axis=0)  # (..., Lq)
    shift = np.where(np.isfinite(top), top, 0.0)
    total = np.exp(lses - shift).sum(axis=0)  # (..., Lq)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1.0)), -np.inf)  # (..., Lq)
    out = sum(np.where(np.isfinite(part)[..., None], np.exp(part - np.where(np.isfinite(lse), lse, 0.0))[..., None] * o, 0.0)
              for o, part in zip(outs, lses, strict=True))  # (..., Lq, Ev): a part weighs exp(its lse - the whole lse)
    return out, lse
