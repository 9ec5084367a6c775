"""One compact NumPy kernel for the whole composable problem, with a `slip` switch per planted bug.

scores = scale * q k^T (query head h reads KV head h // (Hq // Hkv)) -> softcap -> + bias + ALiBi
-> hidden pairs (mask, causal, window, lengths, segments, -inf bias) -> softmax -> @ v, and the
natural-log LSE of the final scores.  The masks are built here from indices, never from `specs`
(a third-party kernel never sees the reference).

Dtypes are storage formats (tests/broken/_kernels.py): 16-bit inputs are computed in float32.

A subclass sets ``slip`` (one of SLIPS) and declares what it claims: the correct computation
with that one slip.  ``gqa_by`` and ``hide_by`` choose between correct-but-different ways.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Capabilities, Semantics

from ._kernels import ALL_DTYPES, NumpyBackend, store, sum_to, widened

SLIPS = (None, "kv_head_modulo", "kv_head_zero", "bias_scaled", "float_mask_as_bool", "causal_ignores_alignment",
         "lse_unscaled", "dk_first_of_group", "window_left_exclusive", "window_right_one_more",
         "window_top_left", "softcap_after_mask", "padded_rows_nan", "segment_end_inclusive", "alibi_pow2_slopes",
         "lengths_of_first_sequence", "segments_of_first_sequence", "lse_base2", "empty_lse_plus_inf")


class VariantKernel(NumpyBackend):
    """The correct kernel unless `slip` says otherwise (see the module docstring)."""

    name = "variant-kernel"
    slip = None
    gqa_by = "index"  # "index": gather KV head h // g | "repeat": np.repeat K/V | "group": reshape the queries
    hide_by = "select"  # "select": where(visible, s, -inf) | "bias": add a 0/-inf bias built from the mask
    lse_base = "e"  # the LSE's base it returns: "e" | "2" (correct either way when declared so)
    empty_lse = "-inf"  # what an empty row's LSE holds: "-inf" | "+inf" (idem)
    capabilities = Capabilities(dtypes=ALL_DTYPES, device="cpu", gradients=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros")

    def __init__(self):
        assert self.slip in SLIPS, self.slip

    # -- the forward pipeline ----------------------------------------------------------
    def _kv_heads(self, x, Hq: int, call):
        """(..., Hkv, L, D) -> (..., Hq, L, D): the KV head each query head reads."""
        Hkv = x.shape[-3]
        if not call.enable_gqa or Hkv == Hq:
            return x
        g = Hq // Hkv
        if self.slip == "kv_head_modulo":
            return np.take(x, np.arange(Hq) % Hkv, axis=-3)  # the slip: h % Hkv, not h // g
        if self.slip == "kv_head_zero":
            return np.take(x, np.zeros(Hq, dtype=int), axis=-3)  # the slip: every head reads KV head 0
        if self.gqa_by == "repeat":
            return np.repeat(x, g, axis=-3)  # (..., Hq, L, D)
        return np.take(x, np.arange(Hq) // g, axis=-3)  # (..., Hq, L, D)

    def _with_kv(self, a, x, call):
        """a (..., Hq, X, Y) @ x (..., Hkv, Y, Z) of each query head's KV head -> (..., Hq, X, Z)."""
        Hq, Hkv = a.shape[-3], x.shape[-3]
        if call.enable_gqa and self.gqa_by == "group" and Hkv != Hq:  # no copy of K/V: group the queries
            ag = a.reshape(a.shape[:-3] + (Hkv, Hq // Hkv) + a.shape[-2:])  # (..., Hkv, g, X, Y)
            y = ag @ x[..., None, :, :]  # (..., Hkv, g, X, Z)
            return y.reshape(y.shape[:-4] + (Hq,) + y.shape[-2:])  # (..., Hq, X, Z)
        return a @ self._kv_heads(x, Hq, call)  # (..., Hq, X, Z)

    def _offset(self, call, Lq, Lk, what: str) -> int:
        if call.causal_alignment != "bottom_right":
            return 0
        if (what, self.slip) in (("causal", "causal_ignores_alignment"), ("window", "window_top_left")):
            return 0  # the slip: this part is aligned top-left whatever was asked
        return Lk - Lq

    def _per_sequence(self, x, slip: str):
        """A field with a value per sequence; the slip reads the first sequence's for the whole batch."""
        x = np.asarray(x)
        return np.broadcast_to(x[:1], x.shape) if self.slip == slip and x.ndim else x

    def _visible(self, call, shape, Lq, Lk):
        """(..., Hq, Lq, Lk) bool: the mask, causal, window, lengths and segments (not the bias)."""
        i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]  # (Lq, 1), (1, Lk)
        vis = np.ones((Lq, Lk), dtype=bool)  # (Lq, Lk)
        if call.is_causal:
            vis = vis & (j <= i + self._offset(call, Lq, Lk, "causal"))
        if call.window is not None:
            left, right = call.window
            d = j - i - self._offset(call, Lq, Lk, "window")  # (Lq, Lk) key j relative to query i's diagonal
            if left is not None:
                vis = vis & ((d > -left) if self.slip == "window_left_exclusive" else (d >= -left))
            if right is not None:
                vis = vis & (d <= right + (self.slip == "window_right_one_more"))
        vis = np.broadcast_to(vis, shape).copy()  # (..., Hq, Lq, Lk)
        if call.mask is not None:
            vis &= np.asarray(call.mask, dtype=bool)
        if call.kv_lengths is not None:
            kv_len = self._per_sequence(call.kv_lengths, "lengths_of_first_sequence")  # the slip: kv_lengths[0]
            vis &= np.arange(Lk) < kv_len[..., None, None, None]
        if call.q_lengths is not None:
            q_len = self._per_sequence(call.q_lengths, "lengths_of_first_sequence")
            vis &= (np.arange(Lq) < q_len[..., None, None])[..., None]
        if call.q_segment_ids is not None:
            qs = self._per_sequence(call.q_segment_ids, "segments_of_first_sequence")[..., None, :, None]  # (..., 1, Lq, 1)
            ks = self._per_sequence(call.kv_segment_ids, "segments_of_first_sequence")  # (..., Lk)
            same = qs == ks[..., None, None, :]  # (..., 1, Lq, Lk)
            if self.slip == "segment_end_inclusive":  # [start, end] not [start, end): the next segment's first key
                none = np.full_like(ks[..., :1], np.iinfo(ks.dtype).min)  # key 0 has no predecessor
                prev = np.concatenate([none, ks[..., :-1]], axis=-1)  # (..., Lk) the segment of key j - 1
                same = same | (qs == prev[..., None, None, :])
            vis &= same
        return vis

    def _slopes(self, call, Hq: int):
        if self.slip == "alibi_pow2_slopes":  # the slip: 2^(-8 h / H) for every head count
            return 2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)
        return np.asarray(call.alibi_slopes, dtype=np.float64)

    def scores(self, q, k, call):
        """(final scores with hidden pairs at -inf, visible, tanh(raw / cap) or None)."""
        scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale)
        raw = self._with_kv(q, np.swapaxes(k, -1, -2), call) * scale  # (..., Hq, Lq, Lk)
        Hq, (Lq, Lk) = raw.shape[-3], raw.shape[-2:]
        bias = None if call.bias is None else np.asarray(call.bias).astype(raw.dtype, copy=False)
        shape = np.broadcast_shapes(raw.shape, () if bias is None else bias.shape,
                                    () if call.mask is None else np.shape(call.mask))
        vis = self._visible(call, shape, Lq, Lk)  # (..., Hq, Lq, Lk)
        hidden_bias = None
        if bias is not None:
            if self.slip == "float_mask_as_bool":  # the slip: bias.bool() - nonzero takes part, nothing added
                vis &= bias.astype(bool)
                bias = None
            else:
                vis &= ~np.isneginf(bias)
                bias = np.where(np.isneginf(bias), raw.dtype.type(0), bias)
        if self.hide_by == "bias":  # the mask and window as a 0/-inf additive bias
            hidden_bias = np.where(vis, raw.dtype.type(0), raw.dtype.type(-np.inf))  # (..., Hq, Lq, Lk)
        s = np.broadcast_to(raw, shape).copy()  # (..., Hq, Lq, Lk)
        tanh = None
        if self.slip == "softcap_after_mask":  # the slip: hidden pairs set to -inf before the cap (-> -cap)
            s[~vis] = -np.inf
        if call.softcap is not None:
            cap = s.dtype.type(call.softcap)
            tanh = np.tanh(s / cap)
            s = cap * tanh
        if bias is not None:
            s = s + (bias * scale if self.slip == "bias_scaled" else bias)  # the slip: scale * (q k^T + bias)
        if call.alibi_slopes is not None:
            o = Lk - Lq if call.causal_alignment == "bottom_right" else 0
            dist = np.abs(np.arange(Lq)[:, None] + o - np.arange(Lk)[None, :])  # (Lq, Lk)
            s = s - (self._slopes(call, Hq)[:, None, None] * dist).astype(s.dtype)  # (..., Hq, Lq, Lk)
        if self.slip == "softcap_after_mask":
            return s, np.isfinite(s), tanh
        s = s + hidden_bias if hidden_bias is not None else np.where(vis, s, -np.inf)
        return s, vis, tanh

    @staticmethod
    def _softmax(s):
        """Row softmax of final scores (hidden at -inf) and its LSE; rows that see nothing are zeros, -inf."""
        m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
        m = np.where(np.isfinite(m), m, s.dtype.type(0))  # empty rows: exp(-inf - 0) = 0
        e = np.exp(s - m)  # (..., Lq, Lk)
        total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        with np.errstate(divide="ignore"):
            lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(total[..., 0]), -np.inf)  # (..., Lq)
        return e / np.where(total == 0, s.dtype.type(1), total), m[..., 0], lse

    @staticmethod
    def _unpadded(call, q, *kv):
        """Padding zeroed (it may hold NaN or garbage): query rows past q_lengths, keys past kv_lengths."""
        if call.q_lengths is not None:
            q = np.where((np.arange(q.shape[-2]) >= np.asarray(call.q_lengths)[..., None, None])[..., None], 0, q)
        if call.kv_lengths is not None:
            pad = (np.arange(kv[0].shape[-2]) >= np.asarray(call.kv_lengths)[..., None, None])[..., None]
            kv = [np.where(pad, 0, x) for x in kv]  # (..., Hkv, Lk, D)
        return (q, *kv)

    def native_attention(self, q, k, v, call):
        q, k, v = self._unpadded(call, *widened(q, k, v))
        s, _, _ = self.scores(q, k, call)  # (..., Hq, Lq, Lk)
        p, m, lse = self._softmax(s)
        out = self._with_kv(p, v, call)  # (..., Hq, Lq, Ev)
        if call.q_lengths is not None and self.slip == "padded_rows_nan":
            # the slip: padded rows are never written, and the buffer (torch.empty) held NaN
            padded = np.arange(q.shape[-2]) >= np.asarray(call.q_lengths)[..., None, None]  # (B, 1, Lq)
            out = np.where(padded[..., None], np.nan, out)  # (..., Hq, Lq, Ev)
        if self.slip == "lse_unscaled":  # the slip: the running max kept unscaled and added back so
            scale = 1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale
            lse = np.where(np.isfinite(lse), lse - m + m / scale, lse)  # (..., Lq) m / scale, not m
        if self.slip == "lse_base2" or self.lse_base == "2":  # log2-sum-exp2, the slip where "e" is declared
            lse = lse / np.log(2.0)
        if self.slip == "empty_lse_plus_inf" or self.empty_lse == "+inf":  # FA2's softmax.h: +inf when sum == 0
            lse = np.where(lse == -np.inf, np.inf, lse)
        out = store(out, call.dtype)
        return (out, lse) if call.return_lse else out

    def native_attention_backward(self, q, k, v, grad_out, call):
        q, k, v = self._unpadded(call, *widened(q, k, v))
        (go,) = widened(grad_out)
        scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale)
        s, _, tanh = self.scores(q, k, call)  # (..., Hq, Lq, Lk)
        p, _, _ = self._softmax(s)
        dp = self._with_kv(go, np.swapaxes(v, -1, -2), call)  # (..., Hq, Lq, Lk) dO V^T
        ds = p * (dp - self._delta(dp, p))  # (..., Hq, Lq, Lk) gradient of the final scores
        dbias = None if call.bias is None or not self.capabilities.bias_gradient else sum_to(ds, call.bias.shape)
        if tanh is not None:
            ds = ds * (1 - tanh * tanh)  # through the softcap
        ds, p = self._backward_reach(call, ds, p)
        dq = self._with_kv(ds, k, call) * scale  # (..., Hq, Lq, E)
        dk_heads = np.swapaxes(ds, -1, -2) @ q * scale  # (..., Hq, Lk, E) one per query head
        # the slip: dK of the group's first query head only, not the group's sum
        dk = self._per_kv_head(dk_heads, k.shape, first_only=self.slip == "dk_first_of_group")  # (..., Hkv, Lk, E)
        dv = self._per_kv_head(np.swapaxes(p, -1, -2) @ go, v.shape)  # (..., Hkv, Lk, Ev)
        grads = (sum_to(dq, q.shape), dk, dv) + (() if dbias is None else (dbias,))
        return tuple(store(g, call.dtype) for g in grads)

    def _delta(self, dp, p):
        """D = rowsum(dP * P) = rowsum(dO * O) (..., Hq, Lq, 1), the backward's pre-pass (a slip hook)."""
        return (dp * p).sum(axis=-1, keepdims=True)

    def _backward_reach(self, call, ds, p):
        """dS and P as the backward's loops reach them for dQ, dK and dV: all of them (a slip hook)."""
        return ds, p

    def _per_kv_head(self, g, shape, first_only=False):
        """(..., Hq, Lk, D) per query head -> the KV input's shape, each group of query heads summed."""
        Hq, Hkv = g.shape[-3], shape[-3]
        if Hq != Hkv:
            grouped = g.reshape(g.shape[:-3] + (Hkv, Hq // Hkv) + g.shape[-2:])  # (..., Hkv, group, Lk, D)
            g = grouped[..., 0, :, :] if first_only else grouped.sum(axis=-3)  # (..., Hkv, Lk, D)
        return sum_to(g, shape)
