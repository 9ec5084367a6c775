"""Shared pieces of the teeth implementations: a NumPy Backend base and a correct masked softmax.

Every broken implementation is the correct computation with *one* realistic slip, so that the
suite has to find that slip and nothing else.  Nothing here imports `specs`: these play the
part of third-party kernels, which never see the reference.

Dtypes are storage formats, as in real kernels: float16 and bfloat16 inputs are read, computed
in float32 and the results written back rounded (a kernel that reads and writes 16-bit and
accumulates in float32), so that a 16-bit run shows the slip and not a cruder arithmetic.
NumPy has no bfloat16: its values travel in float32 storage rounded to bfloat16 and results come
back tagged `Bfloat16`, so the kernel reports the dtype it would have written.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Backend, Capabilities, Semantics, Unsupported

ALL_DTYPES = ("float16", "bfloat16", "float32", "float64")
F64_F32 = ("float64", "float32")


class Bfloat16(np.ndarray):
    """float32 storage holding bfloat16 values: what a bf16 kernel hands back."""


def round_bfloat16(x) -> np.ndarray:
    """Nearest bfloat16, ties to even, on the float32 bit pattern (held in float32); NaN stays NaN."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32)  # like x
    kept = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)  # like x
    return np.where(np.isnan(f), f, kept.view(np.float32))


def store(y, dtype: str) -> np.ndarray:
    """A float32/float64 result written in the call's dtype."""
    if dtype == "bfloat16":
        return round_bfloat16(y).view(Bfloat16)
    return np.asarray(y).astype(dtype, copy=False)


def in_dtype(y, dtype: str) -> np.ndarray:
    """y rounded to dtype's values and computed on as before (float32 for 16-bit): a kernel's
    intermediate written to a 16-bit register or buffer."""
    if dtype == "float16":
        return np.asarray(y).astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return round_bfloat16(y)
    return np.asarray(y)


def widened(*xs) -> list:
    """16-bit storage (float16, or float32 holding bfloat16) computed in float32; others as they are."""
    return [None if x is None else (x.astype(np.float32) if x.dtype == np.float16 else x) for x in xs]


def numpy_caps(*dtypes: str, gradients: bool = False, features=()) -> Capabilities:
    """A NumPy kernel's declaration: the dtypes it runs in (each one more pass of the suite), the optional
    features it takes."""
    return Capabilities(dtypes=dtypes, device="cpu", gradients=gradients, features=frozenset(features))


class NumpyBackend(Backend):
    """A NumPy kernel over the classic hooks: native values are NumPy arrays in the requested dtype.

    float64 only by default: each declared dtype is one more full pass of the suite (the teeth
    test must stay affordable on 2 cores); tests/broken/__init__.py says which run in which."""

    capabilities = Capabilities(dtypes=("float64",), device="cpu", gradients=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def to_native(self, x, dtype):
        if dtype == "bfloat16":
            return round_bfloat16(x)  # (like x) float32 storage, bfloat16 values
        return x if dtype is None else x.astype(dtype)

    def native_dtype(self, y) -> str:
        return "bfloat16" if isinstance(y, Bfloat16) else str(np.asarray(y).dtype)

    def native_attention(self, q, k, v, call):
        return store(self.native_forward(*widened(q, k, v), call.mask, call.is_causal, call.scale), call.dtype)

    def native_attention_backward(self, q, k, v, grad_out, call):
        if type(self).native_backward is Backend.native_backward:
            raise Unsupported(f"{self.name} computes no gradients")
        grads = self.native_backward(*widened(q, k, v, grad_out), call.mask, call.is_causal, call.scale)
        return tuple(store(g, call.dtype) for g in grads)


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
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1) -inf: no key (Lk = 0 too)
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
            new_max = np.maximum(run_max, s.max(axis=-1, keepdims=True, initial=-np.inf))  # (..., Lq, 1)
            shift = np.where(np.isfinite(new_max), new_max, dt.type(0)) if guard_masked_block else new_max
            p = np.exp(s - shift)  # (..., Lq, b) NaN from -inf - -inf without the guard
            alpha = np.exp(run_max - shift)  # (..., Lq, 1) rescales what was summed so far
            run_sum = (run_sum * alpha if rescale_sum else run_sum) + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + p @ v[..., start:start + block, :]  # (..., Lq, Ev)
            run_max = new_max
    return acc / np.where(run_sum == 0, dt.type(1), run_sum)  # (..., Lq, Ev)
