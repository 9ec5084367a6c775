"""Shared pieces of the teeth implementations: a NumPy Backend base and a correct masked softmax.

Every broken implementation is the correct computation with *one* realistic slip, so that the
suite has to find that slip and nothing else.  Nothing here imports `specs`: these play the
part of third-party kernels, which never see the reference.
"""
from __future__ import annotations

import numpy as np

from backends.base import Backend, Capabilities, Semantics

F64_F32 = ("float64", "float32")


class NumpyBackend(Backend):
    """A NumPy kernel: native values are NumPy arrays already cast to the requested dtype.

    float64 only by default: the bugs do not depend on the dtype, and each declared dtype is
    one more full pass of the suite (the teeth test must stay fast on 2 cores)."""

    capabilities = Capabilities(dtypes=("float64",), device="cpu", gradients=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def native_dtype(self, y) -> str:
        return str(np.asarray(y).dtype)


def resolve_scale(q: np.ndarray, scale) -> np.floating:
    """The scale in q's dtype: 1/sqrt(E) unless given."""
    return q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)


def causal(Lq: int, Lk: int, alignment: str = "top_left", offset: int = 0) -> np.ndarray:
    """(Lq, Lk) True where query i sees key j; `offset` shifts the diagonal (bugs use it)."""
    i = np.arange(Lq)[:, None]  # (Lq, 1)
    j = np.arange(Lk)[None, :]  # (1, Lk)
    shift = (Lk - Lq) if alignment == "bottom_right" else 0
    return j <= i + shift + offset  # (Lq, Lk)


def visible(Lq: int, Lk: int, mask, is_causal: bool, alignment: str = "top_left") -> np.ndarray:
    vis = np.ones((Lq, Lk), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)  # (..., Lq, Lk)
    if is_causal:
        vis = vis & causal(Lq, Lk, alignment)  # (..., Lq, Lk)
    return vis


def scores(q: np.ndarray, k: np.ndarray, scale) -> np.ndarray:
    return (q @ np.swapaxes(k, -1, -2)) * scale  # (..., Lq, Lk)


def masked_softmax(s: np.ndarray, vis: np.ndarray) -> np.ndarray:
    """Row softmax over visible keys, max subtracted; rows with no visible key are zeros."""
    s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    row_max = s.max(axis=-1, keepdims=True)  # (..., Lq, 1)
    row_max = np.where(np.isfinite(row_max), row_max, 0)  # empty rows: exp(-inf) stays 0
    e = np.exp(s - row_max)  # (..., Lq, Lk)
    total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    return e / np.where(total == 0, 1, total)  # (..., Lq, Lk)


def attention_weights(q, k, mask, is_causal, scale, alignment="top_left") -> np.ndarray:
    s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
    return masked_softmax(s, visible(q.shape[-2], k.shape[-2], mask, is_causal, alignment))


def sum_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a gradient over broadcast leading axes back to its input's shape."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def softmax_backward(a, v, grad_out):
    """(dS, dV) from weights a (..., Lq, Lk): the chain of seed 004."""
    dv = np.swapaxes(a, -1, -2) @ grad_out  # (..., Lk, Ev)
    da = grad_out @ np.swapaxes(v, -1, -2)  # (..., Lq, Lk)
    ds = a * (da - (da * a).sum(axis=-1, keepdims=True))  # (..., Lq, Lk)
    return ds, dv


def tiled_attention(q, k, v, vis, scale, block: int, rescale_sum=True, guard_masked_block=True):
    """Online (flash-style) softmax over key blocks of `block`; never forms the full score matrix.

    The two flags switch off the two steps real kernels get wrong: rescaling the running sum
    when the running maximum grows, and the -inf guard for a block in which a row sees nothing.
    """
    Lq, Lk, Ev = q.shape[-2], k.shape[-2], v.shape[-1]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], np.shape(vis)[:-2])
    vis = np.broadcast_to(vis, batch + (Lq, Lk))  # (..., Lq, Lk)
    dt = q.dtype
    run_max = np.full(batch + (Lq, 1), -np.inf, dtype=dt)  # (..., Lq, 1)
    run_sum = np.zeros(batch + (Lq, 1), dtype=dt)  # (..., Lq, 1)
    acc = np.zeros(batch + (Lq, Ev), dtype=dt)  # (..., Lq, Ev)
    with np.errstate(invalid="ignore"):
        for start in range(0, Lk, block):
            s = scores(q, k[..., start:start + block, :], scale)  # (..., Lq, b)
            s = np.where(vis[..., start:start + block], s, dt.type(-np.inf))  # (..., Lq, b)
            new_max = np.maximum(run_max, s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
            shift = np.where(np.isfinite(new_max), new_max, dt.type(0)) if guard_masked_block else new_max
            p = np.exp(s - shift)  # (..., Lq, b) NaN from -inf - -inf without the guard
            alpha = np.exp(run_max - shift)  # (..., Lq, 1) rescales what was summed so far
            run_sum = (run_sum * alpha if rescale_sum else run_sum) + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + p @ v[..., start:start + block, :]  # (..., Lq, Ev)
            run_max = new_max
    return acc / np.where(run_sum == 0, dt.type(1), run_sum)  # (..., Lq, Ev)
