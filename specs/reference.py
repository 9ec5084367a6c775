"""The float64 reference: the measuring stick every backend is compared with.

Forward: scores = scale * q k^T, masked to -inf, row maximum subtracted before exp
(seed 004: "resta el máximo de la fila (por estabilidad)"), weights = softmax, output =
weights v, plus the log-sum-exp of each row.

Backward (seed 004's chain):
    dV = A^T dY;  dA = dY V^T;  dS = A * (dA - rowsum(dA * A));
    dQ = dS K * scale;  dK = dS^T Q * scale.

Fully masked rows (no visible key) are left to implementations by the spec.  The
reference's choice: weights, output and gradients of such a row are zeros, and its
log-sum-exp is -inf.  Optimized code must never import this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import Problem, validate, visible


@dataclass(frozen=True)
class Forward:
    problem: Problem
    visible: np.ndarray   # (..., Lq, Lk) bool
    scores: np.ndarray    # (..., Lq, Lk) scale * q k^T, unmasked
    weights: np.ndarray   # (..., Lq, Lk) softmax over visible keys; zeros on empty rows
    output: np.ndarray    # (..., Lq, Ev)
    lse: np.ndarray       # (..., Lq) log-sum-exp of visible scores; -inf on empty rows

    @property
    def empty_rows(self) -> np.ndarray:
        return ~self.visible.any(axis=-1)  # (..., Lq)


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def scores(query, key, scale: float) -> np.ndarray:
    q, k = _f64(query), _f64(key)
    return scale * (q @ np.swapaxes(k, -1, -2))  # (..., Lq, Lk)


def masked_softmax(s: np.ndarray, vis: np.ndarray):
    """Row softmax over visible entries; returns (weights, lse). Stable for |s| up to ~1e300."""
    masked = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    row_max = masked.max(axis=-1, keepdims=True)  # (..., Lq, 1)
    empty = ~np.isfinite(row_max)  # rows with no visible key
    shift = np.where(empty, 0.0, row_max)  # (..., Lq, 1)
    e = np.exp(masked - shift)  # (..., Lq, Lk) exp(-inf) = 0 exactly
    total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1) >= 1 on non-empty rows
    weights = e / np.where(empty, 1.0, total)  # (..., Lq, Lk)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, shift + np.log(np.where(empty, 1.0, total)))[..., 0]  # (..., Lq)
    return weights, lse


def forward(query, key, value, mask=None, is_causal=False, scale=None) -> Forward:
    p = validate(query, key, value, mask, is_causal, scale)
    vis = visible(p)  # (..., Lq, Lk)
    s = scores(p.query, p.key, p.scale)  # (..., Lq, Lk)
    s = np.broadcast_to(s, vis.shape)
    w, lse = masked_softmax(s, vis)  # (..., Lq, Lk), (..., Lq)
    out = w @ _f64(p.value)  # (..., Lq, Ev)
    return Forward(p, vis, s, w, out, lse)


def attention(query, key, value, mask=None, is_causal=False, scale=None) -> np.ndarray:
    return forward(query, key, value, mask, is_causal, scale).output


def _sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Undo broadcasting: sum x over the axes that were broadcast to reach x.shape."""
    while x.ndim > len(shape):
        x = x.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def backward(query, key, value, grad_out, mask=None, is_causal=False, scale=None):
    """(dQ, dK, dV) of sum(output * grad_out), each shaped like its input."""
    fw = forward(query, key, value, mask, is_causal, scale)
    p = fw.problem
    q, k, v = _f64(p.query), _f64(p.key), _f64(p.value)
    dy = _f64(grad_out)  # (..., Lq, Ev)
    a = fw.weights  # (..., Lq, Lk)
    dv = np.swapaxes(a, -1, -2) @ dy  # (..., Lk, Ev)
    da = dy @ np.swapaxes(v, -1, -2)  # (..., Lq, Lk)
    ds = a * (da - (da * a).sum(axis=-1, keepdims=True))  # (..., Lq, Lk) softmax backward
    dq = (ds @ k) * p.scale  # (..., Lq, E)
    dk = (np.swapaxes(ds, -1, -2) @ q) * p.scale  # (..., Lk, E)
    return (_sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape))
