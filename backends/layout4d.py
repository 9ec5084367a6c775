"""Packing a problem's arrays into the (B, H, L, E) tensors that graph runtimes take.

ONNX's `Attention` and OpenVINO's `ScaledDotProductAttention` run compiled graphs with
rank-4 inputs: one leading batch axis, one head axis.  attnspec's problems have any number
of leading axes that broadcast (q (..., Hq, Lq, E)), so the adapters flatten the leading
axes into B here and unflatten the output.  Pure NumPy; works on any array dtype (OpenVINO's
bfloat16 travels as uint16 bit patterns).  Importing it loads no framework.
"""
from __future__ import annotations

import math

import numpy as np


def _heads(x) -> int:
    return x.shape[-3] if x.ndim >= 3 else 1


def _lead(x) -> tuple:
    return tuple(x.shape[:-3])


def as_scores(x):
    """A mask or bias of rank < 2 ((Lk,) or a scalar) as (1, Lk) / (1, 1): it broadcasts the same."""
    return x if x.ndim >= 2 else x.reshape((1,) * (2 - x.ndim) + x.shape)


class Packing:
    """Where each leading axis goes: batch = the broadcast leading axes before the head axis."""

    def __init__(self, q, k, v, call, extras=()):
        extras = [as_scores(x) for x in extras if x is not None]  # masks and biases: (..., Lq, Lk)
        self.lead = tuple(np.broadcast_shapes(*(_lead(x) for x in (q, k, v, *extras))))
        if call.enable_gqa:  # query head h reads KV head h // (Hq // Hkv): K/V keep their own heads
            self.hq = int(np.broadcast_shapes((_heads(q),), *((_heads(x),) for x in extras))[0])
            self.hkv = int(np.broadcast_shapes((_heads(k),), (_heads(v),))[0])
        else:
            self.hq = self.hkv = int(np.broadcast_shapes(*((_heads(x),) for x in (q, k, v, *extras)))[0])
        self.batch = math.prod(self.lead)
        # the output's leading dims, as the problem defines them (no head axis when all inputs are 2-D)
        ranks = max(x.ndim for x in (q, k, v, *extras))
        self.out_lead = (self.lead + (self.hq,)) if ranks >= 3 else ()

    def qkv(self, x, heads: int):
        """(..., H, L, D) -> (B, heads, L, D), contiguous."""
        full = np.broadcast_to(x, self.lead + (heads,) + x.shape[-2:])  # (..., H, L, D)
        return np.ascontiguousarray(full.reshape((self.batch, heads) + x.shape[-2:]))  # (B, H, L, D)

    def scores(self, x):
        """A mask or bias (..., Lq, Lk) -> (B or 1, Hq or 1, Lq, Lk): broadcast axes stay 1 (no copy)."""
        x = as_scores(x)
        b = self.batch if any(n > 1 for n in _lead(x)) else 1
        h = self.hq if _heads(x) > 1 else 1
        full = np.broadcast_to(x, (self.lead if b > 1 else (1,) * len(self.lead)) + (h,) + x.shape[-2:])
        return np.ascontiguousarray(full.reshape((b, h) + x.shape[-2:]))  # (B|1, H|1, Lq, Lk)

    def output(self, y):
        """(B, Hq, Lq, Ev) -> the problem's (..., Lq, Ev)."""
        return y.reshape(self.out_lead + y.shape[-2:])


# ---- a framework's tensors in the 4-D layout a function declares ------------------------------

# The axis orders a function over rank-4 tensors may declare (`declare(layout=...)`): the dense call
# format.  Packed (cu_seqlens) and paged formats are other call formats, not other axis orders.
LAYOUTS_4D = {"BHLE": "(batch, heads, length, head dim): PyTorch's SDPA, jax-naive",
              "BLHE": "(batch, length, heads, head dim): flash-attention, jax.nn.dot_product_attention"}
LSE_LAYOUTS = ("BHL", "BLH")  # the axis order of a returned log-sum-exp (flash-attention: BHL in either layout)


class Fold4D:
    """A problem's (..., H, L, E) tensors as (B, N, L, E) in a declared layout, and the results back.

    Framework-neutral: ``broadcast_to(x, shape)`` and ``swap(x, a, b)`` are the framework's own
    (torch: ``x.expand``/``x.transpose``; jnp: ``broadcast_to``/``swapaxes``), so autograd and
    ``jax.vjp`` see every step.  Leading dims broadcast and fold into B (the head axis is N; with
    grouped heads key/value keep Hkv heads); masks and biases become (B, N, Lq, Lk), lengths (B,),
    segment ids (B, L), ALiBi slopes (N,).
    """

    def __init__(self, q, k, v, call, broadcast_to, swap, layout="BHLE"):
        if layout not in LAYOUTS_4D:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS_4D)}; got {layout!r}")
        self.broadcast_to, self.swap, self.layout = broadcast_to, swap, layout
        shapes = [tuple(x.shape) for x in (q, k, v)]
        if call.enable_gqa:
            lead = tuple(np.broadcast_shapes(*(s[:-3] for s in shapes)))
            self.batch, self.kv_batch = lead + (shapes[0][-3],), lead + (shapes[1][-3],)
        else:
            self.batch = self.kv_batch = tuple(np.broadcast_shapes(*(s[:-2] for s in shapes)))
        self.B = math.prod(self.batch[:-1]) if self.batch else 1
        self.N = self.batch[-1] if self.batch else 1
        self.Lq, self.Ev = shapes[0][-2], shapes[2][-1]

    def _four(self, x, dims):
        x = self.broadcast_to(x, dims + tuple(x.shape[-2:]))  # (..., L, E) broadcast
        x = x.reshape((self.B, dims[-1] if dims else 1) + tuple(x.shape[-2:]))  # (B, N, L, E)
        return self.swap(x, 1, 2) if self.layout == "BLHE" else x  # (B, L, N, E) for BLHE

    def qkv(self, q, k, v):
        return self._four(q, self.batch), self._four(k, self.kv_batch), self._four(v, self.kv_batch)

    def scores(self, x):
        """A mask or bias broadcastable to (..., Lq, Lk) -> (B, N, Lq, Lk) (both layouts take it so)."""
        shape = tuple(x.shape[-2:]) if x.ndim >= 2 else (1,) * (2 - x.ndim) + tuple(x.shape)
        x = self.broadcast_to(x.reshape(shape) if x.ndim < 2 else x, self.batch + shape)
        return x.reshape((self.B, self.N) + shape)

    def per_sequence(self, x, positions: bool = False):
        """Lengths (lead,) -> (B,); segment ids (positions: (lead..., L)) -> (B, L)."""
        tail = tuple(x.shape[-1:]) if positions else ()
        return self.broadcast_to(x, self.batch[:-1] + tail).reshape((self.B,) + tail)

    def slopes(self, x):
        return self.broadcast_to(x.reshape(tuple(x.shape) or (1,)), (self.N,))

    def output(self, y):
        """The function's (B, Lq, N, Ev) or (B, N, Lq, Ev) -> the problem's (..., Lq, Ev)."""
        expected = (self.B, self.Lq, self.N, self.Ev) if self.layout == "BLHE" else (self.B, self.N, self.Lq, self.Ev)
        if tuple(y.shape) != expected:
            raise ValueError(f"the output has shape {tuple(y.shape)}; layout {self.layout} expects {expected}")
        y = self.swap(y, 1, 2) if self.layout == "BLHE" else y  # (B, N, Lq, Ev)
        return y.reshape(self.batch + (self.Lq, self.Ev))

    def lse(self, lse, lse_layout="BHL", padding=None):
        """A returned log-sum-exp -> the problem's (..., Lq): its rows cut from a padded buffer when the
        function declares ``lse_padding=m`` (rows rounded up to a multiple of m, as Triton kernels keep them)."""
        rows = self.Lq if not padding else -(-self.Lq // padding) * padding
        expected = (self.B, self.N, rows) if lse_layout == "BHL" else (self.B, rows, self.N)
        if tuple(lse.shape) != expected:
            why = f"lse_padding={padding}" if padding else "no lse_padding"
            raise ValueError(f"the lse has shape {tuple(lse.shape)}; lse_layout {lse_layout} with {why} expects "
                             f"{expected}")
        lse = self.swap(lse, 1, 2) if lse_layout == "BLH" else lse  # (B, N, rows)
        return lse[:, :, :self.Lq].reshape(self.batch + (self.Lq,))
