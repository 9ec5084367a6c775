"""Positions: which (query, key) pairs a causal triangle or a window keeps, and ALiBi's biases.

Built from indices only, so they read the same in every format.  The problem's fields use them
(`specs.fields`); nothing here knows a problem.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
# where positions are counted: "global" (the padded shapes: today's, and what a batch without the
# field means) or "per_sequence" (each batch element's own lengths and start, as the anchors' varlen
# and KV-cache kernels count them)
POSITIONS = ("global", "per_sequence")


def offset(Lq: int, Lk: int, alignment: str) -> int:
    """Where query i's diagonal meets the keys: Lk - Lq bottom-right aligned, else 0."""
    return Lk - Lq if alignment == "bottom_right" else 0


def sequence_offsets(Lq: int, Lk: int, alignment: str, q_lengths=None, kv_lengths=None, kv_starts=None) -> np.ndarray:
    """Per sequence (lead...,): the key index on query 0's diagonal, o_b, counted per sequence.

    Sequence b's queries are rows [0, q_len_b), its keys [kv_start_b, kv_len_b) (None: 0, Lq, Lk);
    key j sits at position j - kv_start_b.  Bottom-right aligned, its last query meets its last key:
    o_b = kv_len_b - q_len_b (flash-attention's varlen reference, vLLM's ref_paged_attn, JAX's ragged
    attention); top-left, query 0 meets its first key: o_b = kv_start_b.  Query i's diagonal is then
    key i + o_b - the same arithmetic as `offset`, one value per sequence.
    """
    qlen = np.asarray(Lq if q_lengths is None else q_lengths, dtype=np.int64)
    kvlen = np.asarray(Lk if kv_lengths is None else kv_lengths, dtype=np.int64)
    start = np.asarray(0 if kv_starts is None else kv_starts, dtype=np.int64)
    if alignment == "bottom_right":
        return np.broadcast_arrays(kvlen - qlen, start)[0]
    return np.broadcast_arrays(start, qlen, kvlen)[0]


def _diagonal(Lq: int, Lk: int, alignment: str, offsets) -> np.ndarray:
    """j - (i + o): (Lq, Lk) with the global offset, (lead..., 1, Lq, Lk) with per-sequence `offsets`."""
    o = offset(Lq, Lk, alignment) if offsets is None else np.asarray(offsets)[..., None, None, None]
    return np.arange(Lk)[None, :] - np.arange(Lq)[:, None] - o


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


def causal_mask(Lq: int, Lk: int, alignment: str = "top_left", offsets=None) -> np.ndarray:
    """Boolean (Lq, Lk): True where query i may see key j.

    top_left: j <= i (PyTorch's ``is_causal``, JAX's ``is_causal``).
    bottom_right: j <= i + (Lk - Lq), the KV-cache convention (flash-attn >= 2.1).
    With per-sequence ``offsets`` (`sequence_offsets`), j <= i + o_b: (lead..., 1, Lq, Lk).
    """
    if alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"alignment must be 'top_left' or 'bottom_right'; got {alignment!r}")
    return window_mask(Lq, Lk, (None, 0), alignment, offsets)


def window_mask(Lq: int, Lk: int, window, alignment: str = "top_left", offsets=None) -> np.ndarray:
    """Boolean (Lq, Lk): key j inside query i's window [i + o - left, i + o + right], inclusive.

    o = Lk - Lq bottom-right aligned, else 0.  flash-attention's ``window_size=(wl, wr)`` is this
    with bottom_right (its -1 is None here); JAX's ``local_window_size=(L, R)`` with top_left.
    With per-sequence ``offsets`` (`sequence_offsets`) o is o_b and the mask (lead..., 1, Lq, Lk).
    """
    left, right = normalize_window(window)
    d = _diagonal(Lq, Lk, alignment, offsets)  # (Lq, Lk) or (lead..., 1, Lq, Lk): j - (i + o)
    keep = np.ones(d.shape, dtype=bool)
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


def alibi_bias(slopes, Lq: int, Lk: int, alignment: str = "top_left", offsets=None) -> np.ndarray:
    """(H, Lq, Lk): -slope_h * |i + o - j| (flash-attention's form; o as in `window_mask`).

    Under causal masking (j <= i + o) this equals slope_h * (j - i - o), the signed form of
    FlashInfer and attention-gym, up to a per-row constant - which the softmax ignores.  With
    per-sequence ``offsets``, o is o_b: (lead..., H, Lq, Lk).
    """
    s = np.asarray(slopes, dtype=np.float64)  # (H,)
    dist = np.abs(_diagonal(Lq, Lk, alignment, offsets))  # (Lq, Lk) or (lead..., 1, Lq, Lk)
    return -s[:, None, None] * dist  # (H, Lq, Lk) or (lead..., H, Lq, Lk)
