"""Which (query, key) pairs take part, and the position-made biases: causal, window, ALiBi, padding.

Built from indices only, so they read the same in every format.  `visible(problem)` combines
every hiding field of a `specs.problem.Problem`.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from attnspec.specs.problem import CAUSAL_ALIGNMENTS, Problem, _window


def causal_mask(Lq: int, Lk: int, alignment: str = "top_left") -> np.ndarray:
    """Boolean (Lq, Lk): True where query i may see key j.

    top_left: j <= i (PyTorch's ``is_causal``, JAX's ``is_causal``).
    bottom_right: j <= i + (Lk - Lq), the KV-cache convention (flash-attn >= 2.1).
    """
    if alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"alignment must be 'top_left' or 'bottom_right'; got {alignment!r}")
    return window_mask(Lq, Lk, (None, 0), alignment)


def window_mask(Lq: int, Lk: int, window, alignment: str = "top_left") -> np.ndarray:
    """Boolean (Lq, Lk): key j inside query i's window [i + o - left, i + o + right], inclusive.

    o = Lk - Lq bottom-right aligned, else 0.  flash-attention's ``window_size=(wl, wr)`` is this
    with bottom_right (its -1 is None here); JAX's ``local_window_size=(L, R)`` with top_left.
    """
    left, right = _window(window)
    o = (Lk - Lq) if alignment == "bottom_right" else 0
    d = np.arange(Lk)[None, :] - np.arange(Lq)[:, None] - o  # (Lq, Lk) j - (i + o)
    keep = np.ones((Lq, Lk), dtype=bool)  # (Lq, Lk)
    if left is not None:
        keep &= d >= -left
    if right is not None:
        keep &= d <= right
    return keep


def alibi_slopes(n_heads: int) -> np.ndarray:
    """The standard ALiBi slopes (Press et al.), non-power-of-two head counts included.

    For n a power of two: 2^(-8 h / n), h = 1..n.  Otherwise the n' = 2^floor(log2 n) slopes
    of the nearest lower power of two, then every other slope of 2 n' heads (the interpolation
    of the ALiBi reference code and FlashInfer's ``get_slopes``).  For 6 heads: 2^-2, 2^-4,
    2^-6, 2^-8, then 2^-1, 2^-3 - not 2^(-8 h / 6), a common bug (ml-explore/mlx#343).
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, numbers.Integral) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int; got {n_heads!r}")

    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))  # 2^(-8/n)
        return [start ** (h + 1) for h in range(n)]

    n = int(n_heads)
    if n & (n - 1) == 0:
        return np.array(power_of_two(n))
    m = 2 ** int(math.floor(math.log2(n)))
    return np.array(power_of_two(m) + power_of_two(2 * m)[0::2][: n - m])


def alibi_bias(slopes, Lq: int, Lk: int, alignment: str = "top_left") -> np.ndarray:
    """(H, Lq, Lk): -slope_h * |i + o - j| (flash-attention's form; o as in `window_mask`).

    Under causal masking (j <= i + o) this equals slope_h * (j - i - o), the signed form of
    FlashInfer and attention-gym, up to a per-row constant - which the softmax ignores.
    """
    s = np.asarray(slopes, dtype=np.float64)  # (H,)
    o = (Lk - Lq) if alignment == "bottom_right" else 0
    dist = np.abs(np.arange(Lq)[:, None] + o - np.arange(Lk)[None, :])  # (Lq, Lk)
    return -s[:, None, None] * dist  # (H, Lq, Lk)


def padded_query_rows(problem: Problem) -> np.ndarray:
    """Boolean (..., Lq): query rows at or past q_lengths (padding; what they output is left open)."""
    shape = problem.batch_shape + (problem.Lq,)
    if problem.q_lengths is None:
        return np.zeros(shape, dtype=bool)
    lengths = np.asarray(problem.q_lengths)[..., None, None]  # (..., 1, 1): over heads and rows
    return np.broadcast_to(np.arange(problem.Lq) >= lengths, shape)  # (..., Hq, Lq)


def visible(problem: Problem) -> np.ndarray:
    """Boolean (..., Lq, Lk): the pairs that take part (mask, causal, window, lengths, segments, -inf bias)."""
    p = problem
    shape = p.batch_shape + (p.Lq, p.Lk)
    vis = np.ones(shape, dtype=bool)  # (..., Lq, Lk)
    if p.mask is not None:
        vis = vis & np.asarray(p.mask, dtype=bool)
    if p.is_causal:
        vis = vis & causal_mask(p.Lq, p.Lk, p.causal_alignment)
    if p.window is not None:
        vis = vis & window_mask(p.Lq, p.Lk, p.window, p.causal_alignment)
    if p.kv_lengths is not None:
        kv = np.asarray(p.kv_lengths)[..., None, None, None]  # (..., 1, 1, 1)
        vis = vis & (np.arange(p.Lk) < kv)  # (..., Hq, Lq, Lk)
    if p.q_lengths is not None:
        vis = vis & ~padded_query_rows(p)[..., None]
    if p.q_segment_ids is not None:
        qs = np.asarray(p.q_segment_ids)[..., None, :, None]  # (..., 1, Lq, 1)
        ks = np.asarray(p.kv_segment_ids)[..., None, None, :]  # (..., 1, 1, Lk)
        vis = vis & (qs == ks)
    if p.bias is not None:
        vis = vis & ~np.isneginf(np.asarray(p.bias, dtype=np.float64))
    return np.broadcast_to(vis, shape)
