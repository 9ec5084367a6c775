"""Slips a seventh review wrote where a split path's launcher or a backward's tile ranges meet arguments the
grids did not vary: the split path's partial outputs sized by the query's head dim (Ev > E lost), its softcap
folded with 1/sqrt(E) over an explicit scale, its window's right bound dropped, an empty split's LSE written
+inf; the backward's query-tile range with a window's left and right swapped, a window unbounded on the left
taken as a width of -1, and gradients left unwritten at zero sizes; under grouped heads, a backward that maps
a query head to its KV head by a shift (groups of 3) and one that adds dSink at the KV head's index.  Each is
a correct kernel with one slip; the suite reaches each by construction (properties/test_edges.py's split rows and `tile_mask`,
test_gradients.py's window, group-of-3 and grouped-sinks rows and `backward_empty_sizes_pass_nothing`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive, _expand, _unpadded, tile_scores

from ._kernels import numpy_caps
from ._variants import VariantKernel
from .backward_block_bugs import Bwd
from .path_bugs import SPLIT_KEYS as SPLIT_K
from .path_bugs import SPLIT_QUERIES as SPLIT_Q


def _split_kv(q, k) -> bool:
    return q.shape[-2] <= SPLIT_Q and k.shape[-2] >= SPLIT_K


def _naive(features) -> object:
    return replace(NumpyNaive.capabilities, dtypes=("float32", "float64"), features=frozenset(features),
                   formats=("padded",), gradients=False)


def _bwd(features) -> object:
    return numpy_caps("float32", "float64", gradients=True, features=features)


class SplitKvAccumSizedByQkDim(NumpyNaive):
    """Split-KV path (<= 16 queries, >= 512 keys): the partial outputs are allocated and combined with the
    query's head dim E columns; with a value head wider than E (Ev > E) columns E.. come back 0.  Ev < E
    (MLA's 576/512) is right.  Class: FA2's mha_fwd_kvcache out_accum sized by the QK head dim."""

    name = "broken-split-kv-accum-sized-by-qk-dim"
    capabilities = _naive({"gqa", "lse"})

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        E, Ev = q.shape[-1], v.shape[-1]
        if not (_split_kv(q, k) and Ev > E):
            return y
        out, lse = y if call.return_lse else (y, None)
        out = out.copy()
        out[..., E:] = 0  # the slip: the combine's buffer has E columns
        return (out, lse) if call.return_lse else out


class SplitKvSoftcapDefaultScale(NumpyNaive):
    """Split-KV path with a softcap: the launcher folds 1/sqrt(E) into the cap, not the scale the caller gave
    (FA2: params.softcap = softmax_scale / softcap, set from the default in the kvcache launcher)."""

    name = "broken-split-kv-softcap-default-scale"
    capabilities = _naive({"softcap", "gqa", "lse"})

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k) and call.softcap is not None and call.scale is not None:
            call = replace(call, scale=None)  # the slip
        return super().native_attention(q, k, v, call)


class SplitKvDropsWindowRight(NumpyNaive):
    """Split-KV / decode path: the decode kernel takes a left window only (FlashInfer's window_left), the
    wrapper drops the right bound: a non-causal window sees every key to its right."""

    name = "broken-split-kv-drops-window-right"
    capabilities = _naive({"window", "gqa", "lse", "causal_bottom_right"})

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k) and call.window is not None and call.window[1] is not None and not call.is_causal:
            call = replace(call, window=(call.window[0], None))  # the slip
        return super().native_attention(q, k, v, call)


class SplitKvEmptySplitLsePlusInf(NumpyNaive):
    """Split-KV path (256-key splits): a row whose keys in one split are all hidden (a mask, a -inf bias) gets
    that split's LSE from the softmax epilogue, +inf where the row sum is 0 (FA2 softmax.h); the combine takes
    the max of the partial LSEs: exp(+inf - +inf) = NaN for the row.  Splits the block range skips are right."""

    name = "broken-split-kv-empty-split-lse-plus-inf"
    capabilities = _naive({"gqa", "bias", "lse"})
    CHUNK = 256

    def native_attention(self, q, k, v, call):
        if not _split_kv(q, k) or call.sinks is not None:
            return super().native_attention(q, k, v, call)
        k, v = _unpadded(k, call), _unpadded(v, call)
        s = tile_scores(q, k, call, 0, k.shape[-2])  # (..., Hq, Lq, Lk)
        ve = _expand(v, q.shape[-3]) if call.enable_gqa else v  # (..., Hq, Lk, Ev)
        outs, lses = [], []
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for a in range(0, k.shape[-2], self.CHUNK):
                sc = s[..., a:a + self.CHUNK]  # (..., Hq, Lq, C)
                m = sc.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Hq, Lq, 1)
                e = np.exp(sc - np.where(np.isfinite(m), m, 0))
                total = e.sum(axis=-1)  # (..., Hq, Lq)
                outs.append((e @ ve[..., a:a + self.CHUNK, :]) / np.where(total > 0, total, 1)[..., None])
                lse = np.where(total > 0, m[..., 0] + np.log(np.where(total > 0, total, 1)), -np.inf)
                split_sees = np.isfinite(sc).any(axis=(-1, -2))[..., None]  # (..., Hq, 1): the split isn't skipped
                lses.append(np.where((total == 0) & split_sees, np.inf, lse))  # the slip: +inf for an empty row
            L = np.stack(lses)  # (S, ..., Hq, Lq)
            top = L.max(0)
            w = np.exp(L - np.where(np.isneginf(top), 0, top))
            tot = w.sum(0)
            out = (w[..., None] * np.stack(outs)).sum(0) / np.where(tot > 0, tot, 1)[..., None]
            lse = np.where(tot > 0, np.where(np.isneginf(top), 0, top) + np.log(np.where(tot > 0, tot, 1)), -np.inf)
        out = out.astype(q.dtype)
        return (out, lse) if call.return_lse else out


class BwdWindowAsymSwappedTiles(Bwd):
    """Sliding-window backward, non-causal, left != right: the dK/dV pass's query-tile range of key block n is
    computed with the window's left and right swapped; query tiles that see the block only through the longer
    side drop out of dK, dV.  Symmetric and causal windows right.  Class: FA2 flash_bwd Is_local m_block range."""

    name = "broken-bwd-window-asym-swapped-tiles"
    capabilities = _bwd(("window", "causal_bottom_right"))

    def _parts(self, call, ds, p, env):
        if call.window is None or call.is_causal or call.window[0] == call.window[1]:
            return ds, ds, p
        Lq, Lk = p.shape[-2:]
        off = self._offset(call, Lq, Lk, "window")
        left, right = (10 ** 9 if w is None else w for w in call.window)
        n = np.arange(Lk) // self.BN  # (Lk,)
        m_min = np.maximum(0, n * self.BN - off - left) // self.BM  # the slip: left where right belongs
        m_max = ((n + 1) * self.BN - 1 - off + right) // self.BM  # the slip: right where left belongs
        tile = (np.arange(Lq) // self.BM)[:, None]  # (Lq, 1)
        keep = (tile >= m_min[None, :]) & (tile <= m_max[None, :])  # (Lq, Lk)
        return ds, np.where(keep, ds, 0), np.where(keep, p, 0)


class BwdWindowLeftUnboundedDqTiles(Bwd):
    """Backward with a window unbounded on the left ((None, right): flash-attention's window_size_left = -1):
    the dQ pass's first key block for query tile m is (m * 128 + o - window_left) // 128 with -1 taken as a
    width: rows of tiles past the first lose every key block before their own.  dK, dV right."""

    name = "broken-bwd-window-left-unbounded-dq-tiles"
    capabilities = _bwd(("window", "causal_bottom_right"))

    def _parts(self, call, ds, p, env):
        if call.window is None or call.window[0] is not None:
            return ds, ds, p
        Lq, Lk = p.shape[-2:]
        off = self._offset(call, Lq, Lk, "window")
        first = np.maximum(0, (np.arange(Lq) // self.BM) * self.BM + off + 1) // self.BN  # the slip: -(-1)
        keep = (np.arange(Lk) // self.BN)[None, :] >= first[:, None]  # (Lq, Lk)
        return np.where(keep, ds, 0), ds, p


class BwdZeroSizesUnwritten(VariantKernel):
    """Backward with no query (Lq = 0) or no key (Lk = 0): the launcher returns on an empty grid and hands back
    dK, dV (Lq = 0) or dQ (Lk = 0) as torch.empty left them (NaN here), where the gradient is 0."""

    name = "broken-bwd-zero-sizes-unwritten"
    capabilities = _bwd(("gqa",))

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        dq, dk, dv = (np.array(g, copy=True) for g in grads[:3])
        if q.shape[-2] == 0:
            dk[...], dv[...] = np.nan, np.nan  # the slip
        if k.shape[-2] == 0:
            dq[...] = np.nan  # the slip
        return (dq, dk, dv) + tuple(grads[3:])


def _gradient_caps(features) -> object:
    return replace(_naive(features), gradients=True)


class BwdGqaShiftGroup(NumpyNaive):
    """The backward under grouped heads maps query head h to KV head h >> ceil(log2(group)) (the group rounded
    up to its power-of-two tile): right for groups of 2, 4, 8; groups of 3, 5, 6, 7 recompute P with another
    head's K, V and add dK, dV into it.  The forward right.  Class: onnxruntime#29046's dispatch, in a backward."""

    name = "broken-bwd-gqa-shift-group"
    capabilities = _gradient_caps({"gqa", "lse"})

    def native_attention_backward(self, q, k, v, grad_out, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        group = Hq // Hkv
        if not (call.enable_gqa and Hkv > 1 and group > 1 and group & (group - 1)):
            return super().native_attention_backward(q, k, v, grad_out, call)
        heads = np.minimum(np.arange(Hq) >> int(np.ceil(np.log2(group))), Hkv - 1)  # the slip: (Hq,)
        ke, ve = np.take(k, heads, axis=-3), np.take(v, heads, axis=-3)  # (..., Hq, Lk, E)
        dq, dke, dve = super().native_attention_backward(q, ke, ve, grad_out, replace(call, enable_gqa=False))[:3]
        dk, dv = np.zeros(k.shape, dke.dtype), np.zeros(v.shape, dve.dtype)  # (..., Hkv, Lk, E)
        for h in range(Hq):
            dk[..., heads[h], :, :] += dke[..., h, :, :]
            dv[..., heads[h], :, :] += dve[..., h, :, :]
        return dq, dk, dv


class BwdSinksDsinkByKvHead(NumpyNaive):
    """The sinks' backward under grouped heads adds dSink at the index of the KV head its program works on:
    the first Hkv entries hold the groups' sums, the rest stay 0.  One head a KV head right; dQ, dK, dV right.
    Class: an attention-sink backward (gpt-oss; FA3's and FlashInfer's learnable sink) under GQA."""

    name = "broken-bwd-sinks-dsink-by-kv-head"
    capabilities = _gradient_caps({"gqa", "sinks", "lse"})

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if call.sinks is None or not call.enable_gqa or Hq == Hkv:
            return grads
        dsink = np.asarray(grads[-1])  # (Hq,)
        wrong = np.zeros_like(dsink)
        np.add.at(wrong, np.arange(Hq) // (Hq // Hkv), dsink)  # the slip: at the KV head's index
        return grads[:-1] + (wrong,)
