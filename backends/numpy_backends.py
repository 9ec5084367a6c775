"""NumPy backends: the naive one materialises the scores; the tiled one never does.

numpy-naive keeps every step in the input dtype.  numpy-tiled computes float16 inputs in
float32, as FlashAttention keeps its running maximum, sum and accumulator: rescaling a
float16 accumulator block after block would lose the row total.
"""
from __future__ import annotations

import numpy as np

from .base import Backend, Capabilities, Semantics

_NUMPY_DTYPES = ("float16", "float32", "float64")
_ROW_BLOCK = 128  # rows per causal-masking step: bounds the bool temporary to 128*Lk


def _scale(q, scale):
    return q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)


def _mask_future_inplace(s, row0=0, col0=0):
    """Set s[..., i, j] = -inf where key col0+j is after query row0+i (top-left)."""
    Lq, Lk = s.shape[-2:]
    cols = np.arange(col0, col0 + Lk)  # (Lk,)
    for r in range(0, Lq, _ROW_BLOCK):
        rows = np.arange(row0 + r, row0 + min(r + _ROW_BLOCK, Lq))  # (rb,)
        future = cols[None, :] > rows[:, None]  # (rb, Lk) small bool block
        np.copyto(s[..., r:r + len(rows), :], -np.inf, where=future)


def _apply_mask_inplace(s, mask, is_causal, row0=0, col0=0):
    if mask is not None:
        np.copyto(s, -np.inf, where=~mask)  # ~mask: the one bool temporary of the mask path
    if is_causal:
        _mask_future_inplace(s, row0, col0)


def _reduce(g, shape):
    """Sum a gradient over broadcast leading axes back to its input's shape."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


class NumpyNaive(Backend):
    """Materialises the (..., Lq, Lk) score matrix once and does the softmax in place."""

    name = "numpy-naive"
    capabilities = Capabilities(dtypes=_NUMPY_DTYPES, device="cpu", gradients=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def _weights(self, q, k, mask, is_causal, scale):
        s = q @ np.swapaxes(k, -1, -2)  # (..., Lq, Lk) the one O(Lq*Lk) buffer
        s *= _scale(q, scale)
        if mask is not None:
            full = np.broadcast_shapes(s.shape, mask.shape)
            if full != s.shape:  # a mask with more leading dims than q and k
                s = np.broadcast_to(s, full).copy()  # (..., Lq, Lk)
        _apply_mask_inplace(s, mask, is_causal)
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
        sc = _scale(q, scale)
        a = self._weights(q, k, mask, is_causal, scale)  # (..., Lq, Lk)
        dv = np.swapaxes(a, -1, -2) @ grad_out  # (..., Lk, Ev)
        da = grad_out @ np.swapaxes(v, -1, -2)  # (..., Lq, Lk)
        da -= (da * a).sum(axis=-1, keepdims=True)
        da *= a  # dS, in place
        dq = (da @ k) * sc  # (..., Lq, E)
        dk = (np.swapaxes(da, -1, -2) @ q) * sc  # (..., Lk, E)
        return _reduce(dq, q.shape), _reduce(dk, k.shape), _reduce(dv, v.shape)


class NumpyTiled(Backend):
    """Online softmax over key blocks (the FlashAttention recurrence).

    Extra memory is O(Lq * block): one (..., Lq, block) score tile at a time, plus the
    running row maximum m, row sum l and output accumulator.  The backward pass keeps
    only the log-sum-exp from the forward and recomputes each tile (FlashAttention-2).
    """

    name = "numpy-tiled"
    capabilities = Capabilities(dtypes=_NUMPY_DTYPES, device="cpu", gradients=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("float16 inputs are computed in float32 (FlashAttention's accumulators)",))

    def __init__(self, block: int = 128):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be a positive int; got {block!r}")
        self.block = block

    def _blocks(self, Lq, Lk, is_causal):
        """Key blocks [j0, j1); with top-left causal, blocks past the last query are skipped."""
        end = min(Lk, Lq) if is_causal else Lk
        return [(j0, min(j0 + self.block, end)) for j0 in range(0, end, self.block)]

    def _tile(self, q, k, mask, is_causal, sc, j0, j1):
        s = q @ np.swapaxes(k[..., j0:j1, :], -1, -2)  # (..., Lq, b)
        s *= sc
        if mask is not None and mask.shape[-1] != 1:  # a key-broadcast mask is not sliced
            mask = mask[..., j0:j1]  # (..., Lq, b)
        _apply_mask_inplace(s, mask, is_causal, 0, j0)
        return s  # (..., Lq, b)

    def _forward(self, q, k, v, mask, is_causal, scale):
        sc = _scale(q, scale)
        Lq, Lk = q.shape[-2], k.shape[-2]
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                    () if mask is None else mask.shape[:-2])
        m = np.full(batch + (Lq, 1), -np.inf, dtype=q.dtype)  # (..., Lq, 1) running max
        l = np.zeros(batch + (Lq, 1), dtype=q.dtype)  # (..., Lq, 1) running sum
        acc = np.zeros(batch + (Lq, v.shape[-1]), dtype=q.dtype)  # (..., Lq, Ev)
        for j0, j1 in self._blocks(Lq, Lk, is_causal):
            s = self._tile(q, k, mask, is_causal, sc, j0, j1)  # (..., Lq, b)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
            shift = np.where(np.isfinite(m_new), m_new, 0)  # rows with nothing visible yet
            alpha = np.exp(m - shift)  # (..., Lq, 1) rescales what was summed so far
            s -= shift
            np.exp(s, out=s)  # p, in place
            l = l * alpha + s.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += s @ v[..., j0:j1, :]  # (..., Lq, Ev)
            m = m_new
            del s  # free this tile before the next one is computed: one tile alive at a time
        shift = np.where(np.isfinite(m), m, 0)  # (..., Lq, 1) fully masked rows: m = -inf
        total = np.where(l == 0, 1, l)  # (..., Lq, 1) and l = 0: their output stays zero
        return acc / total, shift, total  # (..., Lq, Ev), and the row statistics

    @staticmethod
    def _widen(*xs):
        """float16 runs in float32 (FlashAttention's accumulators); others as given."""
        return [x if x is None or x.dtype != np.float16 else x.astype(np.float32) for x in xs]

    def native_forward(self, q, k, v, mask, is_causal, scale):
        out = self._forward(*self._widen(q, k, v), mask, is_causal, scale)[0]  # (..., Lq, Ev)
        return out.astype(q.dtype, copy=False)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        dtype = q.dtype
        q, k, v, go = self._widen(q, k, v, grad_out)
        sc = _scale(q, scale)
        out, shift, total = self._forward(q, k, v, mask, is_causal, scale)  # (..., Lq, Ev), 2 x (..., Lq, 1)
        d = (go * out).sum(axis=-1, keepdims=True)  # (..., Lq, 1) rowsum(dO * O)
        dq = None
        dk, dv = np.zeros(k.shape, dtype=k.dtype), np.zeros(v.shape, dtype=v.dtype)  # (..., Lk, E|Ev)
        for j0, j1 in self._blocks(q.shape[-2], k.shape[-2], is_causal):
            p = self._tile(q, k, mask, is_causal, sc, j0, j1)  # (..., Lq, b)
            p -= shift
            np.exp(p, out=p)
            p /= total  # the forward's weights for this tile, rounded as the naive softmax does
            dv_blk = np.swapaxes(p, -1, -2) @ go  # (..., b, Ev)
            ds = go @ np.swapaxes(v[..., j0:j1, :], -1, -2)  # (..., Lq, b)
            ds -= d
            ds *= p  # dS of this tile
            dq_blk = (ds @ k[..., j0:j1, :]) * sc  # (..., Lq, E)
            dq = dq_blk if dq is None else dq + dq_blk
            dk[..., j0:j1, :] = _reduce((np.swapaxes(ds, -1, -2) @ q) * sc, dk[..., j0:j1, :].shape)  # (..., b, E)
            dv[..., j0:j1, :] = _reduce(dv_blk, dv[..., j0:j1, :].shape)  # (..., b, Ev)
            del p, ds  # one tile of each alive at a time
        return tuple(g.astype(dtype, copy=False) for g in (_reduce(dq, q.shape), dk, dv))
