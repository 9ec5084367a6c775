"""NumPy backends: the naive one materialises the scores; the tiled one never does."""
from __future__ import annotations

import numpy as np

from .base import Backend, Capabilities, Semantics

_NUMPY_DTYPES = ("float16", "float32", "float64")


def _visible(Lq, Lk, mask, is_causal):
    vis = np.ones((Lq, Lk), dtype=bool) if mask is None else mask  # (..., Lq, Lk)
    if is_causal:
        vis = vis & (np.arange(Lk)[None, :] <= np.arange(Lq)[:, None])  # (..., Lq, Lk)
    return vis


class NumpyNaive(Backend):
    """Materialises the (..., Lq, Lk) score matrix and does the softmax in place."""

    name = "numpy-naive"
    capabilities = Capabilities(dtypes=_NUMPY_DTYPES, device="cpu", gradients=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def _weights(self, q, k, mask, is_causal, scale):
        scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
        s = q @ np.swapaxes(k, -1, -2)  # (..., Lq, Lk) the one O(Lq*Lk) buffer
        s *= scale
        if mask is not None or is_causal:
            vis = _visible(q.shape[-2], k.shape[-2], mask, is_causal)
            full = np.broadcast_shapes(s.shape, vis.shape)
            if full != s.shape:  # a mask with more leading dims than q and k
                s = np.broadcast_to(s, full).copy()
            np.copyto(s, -np.inf, where=~vis)
        row_max = s.max(axis=-1, keepdims=True)  # (..., Lq, 1)
        row_max[~np.isfinite(row_max)] = 0  # fully masked rows: all -inf, keep exp = 0
        s -= row_max
        np.exp(s, out=s)
        total = s.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        total[total == 0] = 1  # fully masked rows stay zero
        s /= total
        return s  # (..., Lq, Lk)

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return self._weights(q, k, mask, is_causal, scale) @ v  # (..., Lq, Ev)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        sc = q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
        a = self._weights(q, k, mask, is_causal, scale)  # (..., Lq, Lk)
        dv = np.swapaxes(a, -1, -2) @ grad_out  # (..., Lk, Ev)
        da = grad_out @ np.swapaxes(v, -1, -2)  # (..., Lq, Lk)
        da -= (da * a).sum(axis=-1, keepdims=True)
        da *= a  # dS, in place
        dq = (da @ k) * sc  # (..., Lq, E)
        dk = (np.swapaxes(da, -1, -2) @ q) * sc  # (..., Lk, E)
        return _reduce(dq, q.shape), _reduce(dk, k.shape), _reduce(dv, v.shape)


def _reduce(g, shape):
    """Sum a gradient over broadcast leading axes back to its input's shape."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
