"""Slips a fourth review wrote, each on a path the draws and the grid did not reach before: a split-KV path
(few queries against 512 keys or more) that leaves out a field (a mask, key lengths, sinks, a broadcast
bias's stride, ALiBi's alignment, the merged LSE), the wide head-dim templates (160..256: a causal branch,
a KV-head map, a query tile's offset of their own), a long prefill's tiling (Lq >= 768), a boolean mask
broadcast over heads, a per-head bias or its gradient under grouped heads, bottom-right causal rows that
see no key (a tile that exits early, an LSE left at 0).  Each is a correct kernel with one slip; the
suite reaches each by construction (properties/test_edges.py's grid, test_lse.py's edge rows,
test_gradients.py's backward grid).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._kernels import numpy_caps, store
from ._variants import VariantKernel
from .path_bugs import _split_kv
from .sink_bugs import SinkKernel


class _Rows(VariantKernel):
    """A helper base: the correct output with some rows overwritten by NaN (a buffer never written)."""

    def _unwritten(self, q, k, call) -> np.ndarray | None:
        """(Lq,) bool: the query rows this kernel leaves unwritten, None for none."""
        return None

    def native_attention(self, q, k, v, call):
        res = super().native_attention(q, k, v, call)
        rows = self._unwritten(q, k, call)
        if rows is None or not rows.any():
            return res
        out, lse = res if call.return_lse else (res, None)
        out = out.copy()  # (..., Lq, Ev) in its storage class
        out[..., rows, :] = np.nan  # torch.empty's NaN
        return (out, lse) if call.return_lse else out


class WideCausalDropped(VariantKernel):
    """The head-dim 192 template (E 161..192) is dispatched with causal off in the causal branch (a
    copy-paste in one instantiation); every other head dim honours causal."""

    name = "broken-wide-causal-dropped"
    capabilities = numpy_caps("bfloat16")

    def native_attention(self, q, k, v, call):
        if 160 < q.shape[-1] <= 192 and call.is_causal:
            call = replace(call, is_causal=False)  # the slip
        return super().native_attention(q, k, v, call)


class WideGqaModulo(VariantKernel):
    """The head-dim 160 and 192 templates (E 129..192) map query head h to KV head h % Hkv, not h // group."""

    name = "broken-wide-gqa-modulo"
    capabilities = numpy_caps("float16", features=("gqa",))

    def native_attention(self, q, k, v, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if 128 < q.shape[-1] <= 192 and call.enable_gqa and Hkv != Hq:
            heads = np.arange(Hq) % Hkv  # the slip
            k, v = np.take(k, heads, axis=-3), np.take(v, heads, axis=-3)  # (..., Hq, Lk, ·)
            call = replace(call, enable_gqa=False)
        return super().native_attention(q, k, v, call)


class WideTileOffset128(_Rows):
    """The head-dim 256 template (E 193..256) takes 64-row query tiles but offsets tile m by m * 128 (the other
    templates' tile height): rows 64..127 of every 128 are never written."""

    name = "broken-wide-tile-offset-128"
    capabilities = numpy_caps("float32")

    def _unwritten(self, q, k, call):
        return np.arange(q.shape[-2]) % 128 >= 64 if 192 < q.shape[-1] <= 256 else None


class SplitKvLseFirstSplit(VariantKernel):
    """The split-KV combine (512-key splits) writes the merged output but returns split 0's LSE."""

    name = "broken-split-kv-lse-first-split"
    capabilities = numpy_caps("float64", features=("lse",))

    def native_attention(self, q, k, v, call):
        if not (call.return_lse and _split_kv(q, k)):
            return super().native_attention(q, k, v, call)
        out, _ = super().native_attention(q, k, v, call)
        first = np.arange(k.shape[-2]) < 512  # (Lk,)
        mask = first if call.mask is None else np.asarray(call.mask, bool) & first  # (..., Lq, Lk)
        _, lse = super().native_attention(q, k, v, replace(call, mask=mask))  # the slip: split 0's
        return out, lse


class EmptyQueryTileUnwritten(_Rows):
    """Bottom-right causal with 64 or more queries than keys: a 64-row query tile none of whose rows sees a
    key returns before writing its output (flash-attention#1778); zeros are declared for such rows."""

    name = "broken-empty-query-tile-unwritten"
    capabilities = numpy_caps("float16", features=("causal_bottom_right",))

    def _unwritten(self, q, k, call):
        Lq, Lk = q.shape[-2], k.shape[-2]
        if not (call.is_causal and call.causal_alignment == "bottom_right" and Lq - Lk >= 64):
            return None
        return (np.arange(Lq) // 64) * 64 + 63 < Lq - Lk  # the tile's last row sees nothing either


class EmptyRowsLseZero(VariantKernel):
    """Bottom-right causal with more queries than keys: the row loop skips the rows that see nothing and
    their LSE keeps the buffer's 0 (flashinfer#4452), where -inf is declared."""

    name = "broken-empty-rows-lse-zero"
    capabilities = numpy_caps("bfloat16", features=("lse", "causal_bottom_right"))
    semantics = replace(VariantKernel.semantics, empty_lse="-inf")

    def native_attention(self, q, k, v, call):
        res = super().native_attention(q, k, v, call)
        Lq, Lk = q.shape[-2], k.shape[-2]
        if not (call.return_lse and call.is_causal and call.causal_alignment == "bottom_right" and Lq > Lk):
            return res
        out, lse = res
        lse = np.array(lse)
        lse[..., : Lq - Lk] = 0.0  # the slip
        return out, lse


class DecodeDropsMask(VariantKernel):
    """The single-query decode kernel for long caches (Lq = 1, Lk >= 512) takes no mask and drops it."""

    name = "broken-decode-drops-mask"
    capabilities = numpy_caps("float32")

    def native_attention(self, q, k, v, call):
        if q.shape[-2] == 1 and k.shape[-2] >= 512:
            call = replace(call, mask=None)  # the slip
        return super().native_attention(q, k, v, call)


class SplitKvIgnoresKeyLengths(VariantKernel):
    """The split-KV path splits the padded length and never reads kv_lengths: padding keys are attended."""

    name = "broken-split-kv-ignores-key-lengths"
    capabilities = numpy_caps("float16", features=("seq_lengths",))

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k):
            call = replace(call, kv_lengths=None)  # the slip
        return super().native_attention(q, k, v, call)


class LongPrefillTopLeft(VariantKernel):
    """The long-prefill tiling (256-row query tiles from Lq 768, as PyTorch's CPU flash) bounds its causal
    loop top-left whatever alignment is asked; the shorter paths honour it."""

    name = "broken-long-prefill-top-left"
    capabilities = numpy_caps("float64", features=("causal_bottom_right",))

    def native_attention(self, q, k, v, call):
        if q.shape[-2] >= 768:
            call = replace(call, causal_alignment="top_left")  # the slip
        return super().native_attention(q, k, v, call)


class GqaBiasByKvHead(VariantKernel):
    """A per-head bias (..., Hq, Lq, Lk) under grouped heads read at the KV head's index (a pack-GQA tile
    reading the bias at its KV head): query heads of a group share one bias."""

    name = "broken-gqa-bias-by-kv-head"
    capabilities = numpy_caps("float32", features=("gqa", "bias"))

    def native_attention(self, q, k, v, call):
        Hq, Hkv, b = q.shape[-3], k.shape[-3], call.bias
        if b is not None and call.enable_gqa and Hkv != Hq and np.ndim(b) >= 3 and np.shape(b)[-3] == Hq:
            b = np.take(np.asarray(b), np.arange(Hq) // (Hq // Hkv), axis=-3)  # the slip
            call = replace(call, bias=b)
        return super().native_attention(q, k, v, call)


class SplitKvDropsSinks(SinkKernel):
    """The split-KV decode path has no sink argument and drops the sinks (vllm#52148's class); shorter
    problems fold the sink as the correct SinkKernel does."""

    name = "broken-split-kv-drops-sinks"
    capabilities = replace(SinkKernel.capabilities, dtypes=("bfloat16",))

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k):
            call = replace(call, sinks=None)  # the slip
        return super().native_attention(q, k, v, call)


class SplitKvAlibiBottomRight(VariantKernel):
    """The split-KV path takes ALiBi distances to the last key (the decode convention) whatever alignment is
    asked; its causal mask follows the asked one."""

    name = "broken-split-kv-alibi-bottom-right"
    capabilities = numpy_caps("float16", features=("alibi", "causal_bottom_right"))

    def native_attention(self, q, k, v, call):
        if not (_split_kv(q, k) and call.alibi_slopes is not None and call.causal_alignment != "bottom_right"):
            return super().native_attention(q, k, v, call)
        Lq, Lk = q.shape[-2], k.shape[-2]
        dist = np.abs(np.arange(Lq)[:, None] + (Lk - Lq) - np.arange(Lk))  # (Lq, Lk) the slip: bottom-right
        alibi = -np.asarray(call.alibi_slopes, np.float64)[:, None, None] * dist  # (Hq, Lq, Lk)
        bias = alibi if call.bias is None else np.asarray(call.bias, np.float64) + alibi
        return super().native_attention(q, k, v, replace(call, alibi_slopes=None, bias=bias))


class SplitKvBiasQueryStride(VariantKernel):
    """The split-KV path addresses the bias as dense (..., Lq, Lk): a bias broadcast over queries
    ((B, 1, 1, Lk): stride 0 on the query axis) is read with query stride Lk, so query row i reads the
    row i planes further on (clamped at the end)."""

    name = "broken-split-kv-bias-query-stride"
    capabilities = numpy_caps("float32", features=("bias",))

    def native_attention(self, q, k, v, call):
        b, Lq, Lk = call.bias, q.shape[-2], k.shape[-2]
        if not (_split_kv(q, k) and b is not None and np.ndim(b) == 4 and np.shape(b)[-2] == 1 and Lq > 1):
            return super().native_attention(q, k, v, call)
        flat = np.ascontiguousarray(b).reshape(-1)  # (Bb * Hb * Lk,)
        planes = np.arange(np.shape(b)[0] * np.shape(b)[1]).reshape(np.shape(b)[:2])[..., None, None]  # (Bb, Hb, 1, 1)
        at = (planes + np.arange(Lq)[:, None]) * Lk + np.arange(Lk)  # (Bb, Hb, Lq, Lk) the slip: query stride Lk
        return super().native_attention(q, k, v, replace(call, bias=flat[np.minimum(at, flat.size - 1)]))


class MaskHeadBroadcastBatch0(VariantKernel):
    """A boolean mask broadcast over heads ((B, 1, ·, Lk), a model's key-padding mask) is read with batch
    stride 0 when its head stride is 0 (a 'shared mask' test): every sequence gets the first one's."""

    name = "broken-mask-head-broadcast-batch0"
    capabilities = numpy_caps("float64")

    def native_attention(self, q, k, v, call):
        m = call.mask
        if m is not None and np.ndim(m) == 4 and np.shape(m)[0] > 1 and np.shape(m)[1] == 1 and q.shape[-3] > 1:
            call = replace(call, mask=np.broadcast_to(np.asarray(m)[:1], np.shape(m)))  # the slip
        return super().native_attention(q, k, v, call)


class DbiasGqaFirstOfGroup(VariantKernel):
    """dBias of a per-head bias under grouped heads: the pack-GQA backward tile stores the group's first
    query head's dS into every head of the group; the forward, dQ, dK and dV are right."""

    name = "broken-dbias-gqa-first-of-group"
    capabilities = replace(numpy_caps("float64", gradients=True, features=("gqa", "bias")), bias_gradient=True)

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if len(grads) < 4 or not call.enable_gqa or Hq == Hkv or np.ndim(grads[3]) < 3 or grads[3].shape[-3] != Hq:
            return grads
        first = (np.arange(Hq) // (Hq // Hkv)) * (Hq // Hkv)  # each head's group's first head
        return (*grads[:3], np.take(grads[3], first, axis=-3))  # the slip


class BwdEmptyRowNaN(VariantKernel):
    """The backward recomputes P = exp(S - LSE) with LSE = -inf stored for a row that sees no key (FA3's
    convention) and no guard (FA2 stores +inf there for this reason): exp(-inf + inf) = NaN across that
    row, so its dQ and, through the sums over rows, its head's dK and dV are NaN (flash-attention#443's
    class).  The forward (zeros there, as declared) and every problem whose rows all see a key: right."""

    name = "broken-bwd-empty-row-nan"
    capabilities = numpy_caps("float32", gradients=True, features=("gqa",))

    def _backward_reach(self, call, ds, p):
        ds, p = super()._backward_reach(call, ds, p)
        empty = ~(p > 0).any(axis=-1, keepdims=True)  # (..., Hq, Lq, 1) a row's largest weight is > 0
        return np.where(empty, np.nan, ds), np.where(empty, np.nan, p)  # the slip


class BwdEmptyTileDqUnwritten(VariantKernel):
    """The backward skips a 64-row query tile whose rows see no key and leaves its dQ rows as allocated
    (torch.empty: NaN here): the backward twin of a forward tile that exits early (flash-attention#1778).
    dK and dV, single empty rows and every other tile: right."""

    name = "broken-bwd-empty-tile-dq-unwritten"
    capabilities = numpy_caps("bfloat16", gradients=True, features=("causal_bottom_right",))

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        _, lse = super().native_attention(q, k, v, replace(call, return_lse=True))  # (..., Hq, Lq)
        empty = np.all(~np.isfinite(np.asarray(lse, np.float64)), axis=tuple(range(np.ndim(lse) - 1)))  # (Lq,)
        tiles = [t for t in range(0, empty.shape[0], 64) if empty[t:t + 64].all()]
        if not tiles:
            return grads
        dq = np.array(grads[0], dtype=np.float64)  # (..., Hq, Lq, E)
        for t in tiles:
            dq[..., t:t + 64, :] = np.nan  # the slip: never written
        return (store(dq, call.dtype), *grads[1:])
