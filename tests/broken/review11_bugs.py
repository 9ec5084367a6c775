"""Slips an eleventh review wrote where a kernel's templates, launchers and merge meet inputs the draws never
gave: a window's left bound of 0 read as "none", MLA's (192, 128) template masking top-left whatever is asked,
a wide head dim's non-causal grid sized for 128-row tiles, ALiBi slopes recomputed from the head count (a
tensor-parallel rank's slice ignored), a backward launcher dropping the left padding, a backward dispatch
losing causal at head dims 80-128, a merge writing 256 value columns, a head-dim 256 template run without its
window, a decode's LSEs stored at a power-of-two group stride, and the softcap backward's K tiled over heads
(h % Hkv) under grouped heads.  Each is numpy-naive (correct in every format it declares) with one slip; the
suite reaches each by construction (the edge grid's window (0, 3), wide non-causal and windowed rows and MLA's
bottom-right chunk; ALiBi drawn as a rank's slice; the backward grid's causal E 80/128, left padding, window
(0, 3), MLA and grouped softcap rows; the LSE edges' grouped decodes; test_merge.py's 512-wide states).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive, _dsink, _expand, _group_sum, _reduce, _scale, _unpadded

_DTYPES = ("float32", "float64")


def _caps(gradients: bool = True):
    return replace(NumpyNaive.capabilities, dtypes=_DTYPES, gradients=gradients)


def _standard_slopes(n: int) -> np.ndarray:
    """ALiBi's slopes for n heads as the paper's get_slopes builds them (the kernel's own copy)."""
    def pow2(m):
        start = 2.0 ** (-(2.0 ** -(np.log2(m) - 3)))
        return [start * start ** i for i in range(m)]
    if np.log2(n).is_integer():
        return np.array(pow2(n))
    c = 2 ** int(np.floor(np.log2(n)))
    return np.array(pow2(c) + _standard_slopes(2 * c)[0::2][: n - c].tolist())


class _CallSlip(NumpyNaive):
    """A slip in the call's fields, made alike on the forward and the backward (`_slip`)."""

    capabilities = _caps()

    def _slip(self, q, v, call):
        return call

    def native_attention(self, q, k, v, call):
        return super().native_attention(q, k, v, self._slip(q, v, call))

    def native_attention_backward(self, q, k, v, grad_out, call):
        return super().native_attention_backward(q, k, v, grad_out, self._slip(q, v, call))


class WindowLeftZeroUnbounded(_CallSlip):
    """The window's left bound read by truthiness (`if window_left:`): (0, r), each query its own key and r
    after, runs unbounded on the left (0 is a real bound: FlashInfer's window_left >= 0)."""

    name = "broken-window-left-zero-unbounded"

    def _slip(self, q, v, call):
        if call.window is None or call.window[0] != 0:
            return call
        right = call.window[1]
        return replace(call, window=None if right is None else (None, right))


class MlaCausalTopLeft(_CallSlip):
    """MLA's (192, 128) prefill template (128 < E <= 192, Ev <= 128) masks causal top-left whatever is asked: a
    chunk against its cache (Lq < Lk, bottom-right) loses its own prefix.  Every other template right."""

    name = "broken-mla-causal-top-left"

    def _slip(self, q, v, call):
        if 128 < q.shape[-1] <= 192 and v.shape[-1] <= 128 and call.causal_alignment == "bottom_right":
            return replace(call, causal_alignment="top_left")
        return call


class Hdim256WindowLeftDropped(_CallSlip):
    """The head-dim 256 template launched with window_left = -1 (pegainfer#818: Gemma's local layers ran
    global); its right bound and causal kept."""

    name = "broken-hdim256-window-left-dropped"

    def _slip(self, q, v, call):
        if q.shape[-1] <= 192 or call.window is None or call.window[0] is None:
            return call
        right = call.window[1]
        return replace(call, window=None if right is None else (None, right))


class AlibiSlopesRecomputed(_CallSlip):
    """The padded path computes the standard slopes of its head count, not the caller's (flashinfer#1606: every
    tensor-parallel rank but the first got the wrong ones); its per-sequence paths read the caller's."""

    name = "broken-alibi-slopes-recomputed"

    def _slip(self, q, v, call):
        if call.alibi_slopes is None or call.positions == "per_sequence":
            return call
        return replace(call, alibi_slopes=_standard_slopes(q.shape[-3]))


class WideNonCausalGridHalf(NumpyNaive):
    """The non-causal head-dim 160/192 template runs 64-row query tiles on a grid sized for 128-row ones: only
    ceil(Lq / 128) tiles launch, the rows past them are never written (zeros here)."""

    name = "broken-wide-noncausal-grid-half"
    capabilities = _caps(gradients=False)

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        E, Ev, Lq = q.shape[-1], v.shape[-1], q.shape[-2]
        if not (128 < E <= 192 and Ev == E) or call.is_causal or Lq <= 64:
            return y
        out, lse = y if call.return_lse else (y, None)
        out = out.copy()
        out[..., -(-Lq // 128) * 64:, :] = 0  # the slip: those rows' tiles never launched
        return (out, lse) if call.return_lse else out


class BwdLeftPaddingIgnored(NumpyNaive):
    """A backward launcher that passes no left padding (kv_starts; flash-attention#1788 dropped cache_leftpad in a
    forward): the recompute sees the padding keys and the diagonal moves."""

    name = "broken-bwd-left-padding-ignored"
    capabilities = _caps()

    def native_attention_backward(self, q, k, v, grad_out, call):
        return super().native_attention_backward(q, k, v, grad_out, replace(call, kv_starts=None))


class BwdHdim128CausalDropped(NumpyNaive):
    """The backward's head-dim 128 template (64 < E <= 128) reached through a dispatch whose causal arm passes
    Is_causal=false: dQ, dK, dV as if nothing were causal there; the forward and the other templates right."""

    name = "broken-bwd-hdim128-causal-dropped"
    capabilities = _caps()

    def native_attention_backward(self, q, k, v, grad_out, call):
        if 64 < q.shape[-1] <= 128 and call.is_causal:
            call = replace(call, is_causal=False)  # the slip
        return super().native_attention_backward(q, k, v, grad_out, call)


class MergeColumnsPast256(NumpyNaive):
    """A list merge whose value loop is one 256-column pass (flashinfer#761's head-dim dispatch of merge_states):
    MLA's 512-wide values keep columns 256.. unwritten (zeros).  The LSE right."""

    name = "broken-merge-columns-past-256"
    capabilities = _caps(gradients=False)

    def native_merge_states(self, o_parts, lse_parts):
        o, lse = super().native_merge_states(o_parts, lse_parts)
        o = o.copy()
        o[..., 256:] = 0  # the slip
        return o, lse


class DecodeGqaLsePow2Stride(NumpyNaive):
    """A decode (Lq = 1) kernel packing a KV head's group into a tile of next_pow2(g) rows stores each row's LSE
    at kv_head * tile + r: groups of 3, 5, 6, 7 put LSEs on other heads and leave some unwritten (0 here)."""

    name = "broken-decode-gqa-lse-pow2-stride"
    capabilities = _caps(gradients=False)

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        Hq, Hkv, Lq = q.shape[-3], k.shape[-3], q.shape[-2]
        g = Hq // Hkv if call.enable_gqa else 1
        if not call.return_lse or Lq != 1 or g & (g - 1) == 0:
            return y
        out, lse = y
        tile = 1 << (g - 1).bit_length()
        got = np.zeros_like(lse)
        for kvh in range(Hkv):
            for r in range(g):
                if kvh * tile + r < Hq:
                    got[..., kvh * tile + r, :] = lse[..., kvh * g + r, :]  # the slip: the tile's stride
        return out, got


class SoftcapBackwardGqaTiled(NumpyNaive):
    """The backward's tanh' recompute expands K over the query heads with a tile (`.repeat`: head h reads KV head
    h % Hkv) where the rest uses repeat_interleave (h // g): right without groups and for one KV head."""

    name = "broken-softcap-backward-gqa-tiled"
    capabilities = _caps()

    def native_attention_backward(self, q, k, v, grad_out, call):
        if call.softcap is None or not call.enable_gqa or call.bias is not None:
            return super().native_attention_backward(q, k, v, grad_out, call)
        sc = _scale(q, call.scale)
        k, v = _unpadded(k, call), _unpadded(v, call)
        a, _, a_sink = self._weights(q, k, call)  # (..., Hq, Lq, Lk)
        ke, ve = (_expand(x, a.shape[-3]) for x in (k, v))  # (..., Hq, Lk, E) each
        dv = np.swapaxes(a, -1, -2) @ grad_out  # (..., Hq, Lk, Ev)
        da = grad_out @ np.swapaxes(ve, -1, -2)  # (..., Hq, Lq, Lk)
        da -= (da * a).sum(axis=-1, keepdims=True)
        da *= a
        tiled = np.tile(k, (1,) * (k.ndim - 3) + (q.shape[-3] // k.shape[-3], 1, 1))  # (..., Hq, Lk, E): the slip
        t = np.tanh((q @ np.swapaxes(tiled, -1, -2)) * sc / q.dtype.type(call.softcap))  # (..., Hq, Lq, Lk)
        da *= 1 - t * t
        dq = (da @ ke) * sc  # (..., Hq, Lq, E)
        dk = (np.swapaxes(da, -1, -2) @ q) * sc  # (..., Hq, Lk, E)
        grads = (_reduce(dq, q.shape), _reduce(_group_sum(dk, k.shape[-3]), k.shape),
                 _reduce(_group_sum(dv, v.shape[-3]), v.shape))
        return grads if call.sinks is None else grads + (_dsink(call, a_sink, grad_out, a @ ve),)
