"""Positions: which (query, key) pairs a causal triangle or a window keeps, and ALiBi's biases.

Built from indices only, so they read the same in every format.  The problem's fields use them
(`specs.fields`); nothing here knows a problem.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def offset(Lq: int, Lk: int, alignment: str) -> int:
    """Where query i's diagonal meets the keys: Lk - Lq bottom-right aligned, else 0."""
    return Lk - Lq if alignment == "bottom_right" else 0


def normalize_window(window):
    """(left, right) with ints >= 0 or None (unbounded); ValueError naming `window` otherwise."""
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be (left, right) with ints >= 0 or None (unbounded); got {window!r}") from None
    out = []
    for side, w in (("left", left), ("right", right)):
        if w is None:
            out.append(None)
            continue
        if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 0:
            raise ValueError(f"window {side} must be an int >= 0 or None (unbounded); got window={window!r}")
        out.append(int(w))
    return tuple(out)


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
    left, right = normalize_window(window)
    d = np.arange(Lk)[None, :] - np.arange(Lq)[:, None] - offset(Lq, Lk, alignment)  # (Lq, Lk) j - (i + o)
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
    dist = np.abs(np.arange(Lq)[:, None] + offset(Lq, Lk, alignment) - np.arange(Lk)[None, :])  # (Lq, Lk)
    return -s[:, None, None] * dist  # (H, Lq, Lk)
