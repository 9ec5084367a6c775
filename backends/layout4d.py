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
