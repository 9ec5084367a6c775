"""Masking slips: off-by-one diagonals, polarity, alignment, finite fills, forgotten flags."""
from __future__ import annotations

import numpy as np

from ._kernels import NumpyBackend, causal, masked_softmax, numpy_caps, resolve_scale, scores


def _attend(q, k, v, vis, scale):
    return masked_softmax(scores(q, k, resolve_scale(q, scale)), vis) @ v  # (..., Lq, Ev)


def _user_mask(Lq, Lk, mask):
    return np.ones((Lq, Lk), dtype=bool) if mask is None else mask  # (..., Lq, Lk)


class CausalDiagonalExcluded(NumpyBackend):
    """Causal mask built with ``j < i`` (``torch.triu(..., diagonal=0)`` for the masked part):
    a query no longer sees its own key, and query 0 sees nothing."""

    name = "broken-causal-diagonal-excluded"
    capabilities = numpy_caps("float32")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        vis = _user_mask(Lq, Lk, mask)
        if is_causal:
            vis = vis & causal(Lq, Lk, offset=-1)  # (..., Lq, Lk) j <= i - 1
        return _attend(q, k, v, vis, scale)


class CausalOneAhead(NumpyBackend):
    """Causal mask built with ``j <= i + 1`` (``triu(diagonal=2)``): every query peeks one key
    into the future."""

    name = "broken-causal-one-ahead"
    capabilities = numpy_caps("bfloat16")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        vis = _user_mask(Lq, Lk, mask)
        if is_causal:
            vis = vis & causal(Lq, Lk, offset=1)  # (..., Lq, Lk) j <= i + 1
        return _attend(q, k, v, vis, scale)


class InvertedMask(NumpyBackend):
    """Boolean mask read with the opposite polarity (True = masked out, as in
    ``nn.MultiheadAttention``'s key_padding_mask), while the spec says True = takes part."""

    name = "broken-inverted-mask"
    capabilities = numpy_caps("float16")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        vis = _user_mask(Lq, Lk, None if mask is None else ~mask)  # (..., Lq, Lk)
        if is_causal:
            vis = vis & causal(Lq, Lk)
        return _attend(q, k, v, vis, scale)


class CausalBottomRightDeclaredTopLeft(NumpyBackend):
    """flash-attn 2.1 moved ``causal=True`` to the bottom-right corner (Dao-AILab/flash-attention
    #951, README "2.1: change behavior of causal flag"); a wrapper that still declares PyTorch's
    top-left alignment gives other answers whenever Lq != Lk."""

    name = "broken-causal-bottom-right"
    capabilities = numpy_caps("float32", "float64")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        vis = _user_mask(Lq, Lk, mask)
        if is_causal:
            vis = vis & causal(Lq, Lk, "bottom_right")  # (..., Lq, Lk) j <= i + Lk - Lq
        return _attend(q, k, v, vis, scale)


class CausalIgnoredWithoutMask(NumpyBackend):
    """The early return in a mask helper tests only ``mask is None`` and so skips the causal
    mask when no explicit mask is given: the pattern of jax-ml/jax#32300 (``_apply_masks`` returned
    early and ignored ``local_window_size`` when ``mask`` was None; fixed in jax-ml/jax#32357)."""

    name = "broken-causal-ignored-without-mask"
    capabilities = numpy_caps("float64")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        if mask is None:  # the early return: "nothing to mask"
            vis = np.ones((Lq, Lk), dtype=bool)  # (Lq, Lk)
        else:
            vis = mask & causal(Lq, Lk) if is_causal else mask  # (..., Lq, Lk)
        return _attend(q, k, v, vis, scale)


class FiniteMaskFill(NumpyBackend):
    """Masked scores filled with a finite -1e4 (BERT-era ``(1 - mask) * -10000.0``; a finite fill
    was also the bug in hyunwoongko/transformer#10) instead of -inf.  Masked keys keep weight
    whenever the visible logits are far below -1e4, and a fully masked row becomes the mean of
    the values although zeros are declared."""

    name = "broken-finite-mask-fill"
    capabilities = numpy_caps("float64")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        vis = _user_mask(Lq, Lk, mask)
        if is_causal:
            vis = vis & causal(Lq, Lk)
        s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
        s = np.where(vis, s, s.dtype.type(-1e4))  # (..., Lq, Lk) finite fill
        everything = np.ones(s.shape[-2:], dtype=bool)  # (Lq, Lk)
        return masked_softmax(s, everything) @ v  # (..., Lq, Ev)
