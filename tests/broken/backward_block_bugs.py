"""Slips a fifth review wrote in the backward past its first 128-key block or 128-row query tile, where the
drawn lengths (to ~129) do not reach: a window's tile range in the dK/dV pass and in a pack-GQA dQ pass,
dBias of a bias broadcast over queries or the batch stored rather than summed, padded keys of a tail block,
ALiBi's distance in later key blocks, segments across block edges, the softcap's tanh' on later blocks,
dSink from the first query tile only.  Each is a correct kernel with one slip; the suite reaches each by
construction (properties/test_gradients.py's backward grid).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._kernels import numpy_caps, store, sum_to, widened
from ._variants import VariantKernel
from .sink_bugs import SinkKernel


def _caps(dtypes, features, gradients=False, bias_gradient=False):
    c = numpy_caps(*dtypes, gradients=gradients, features=features)
    return replace(c, bias_gradient=bias_gradient) if bias_gradient else c


class Bwd(VariantKernel):
    """VariantKernel's backward with separate hooks for what the dQ pass and the dK/dV pass read."""

    name = "broken-bwd-base"
    BM = BN = 128

    def native_attention_backward(self, q, k, v, grad_out, call):
        q, k, v = self._unpadded(call, *widened(q, k, v))
        (go,) = widened(grad_out)
        scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale)
        s, vis, tanh = self.scores(q, k, call)  # (..., Hq, Lq, Lk)
        p, _, lse = self._softmax(s)
        dp = self._with_kv(go, np.swapaxes(v, -1, -2), call)  # (..., Hq, Lq, Lk)
        D = (dp * p).sum(axis=-1, keepdims=True)  # (..., Hq, Lq, 1)
        ds = p * (dp - D)
        dbias = None
        if call.bias is not None and self.capabilities.bias_gradient:
            dbias = self._dbias(ds, call)
        fac = None if tanh is None else (1 - tanh * tanh)
        env = dict(q=q, k=k, v=v, go=go, s=s, vis=vis, p=p, lse=lse, dp=dp, D=D, fac=fac, scale=scale)
        ds_q, ds_k, p_v = self._parts(call, ds if fac is None else ds * fac, p, env)
        dq = self._with_kv(ds_q, k, call) * scale
        dk = self._per_kv_head(np.swapaxes(ds_k, -1, -2) @ q * scale, k.shape)
        dv = self._per_kv_head(np.swapaxes(p_v, -1, -2) @ go, v.shape)
        grads = (sum_to(dq, q.shape), dk, dv) + (() if dbias is None else (dbias,))
        return tuple(store(g, call.dtype) for g in grads)

    def _dbias(self, ds, call):
        return sum_to(ds, call.bias.shape)

    def _parts(self, call, ds, p, env):
        """(dS the dQ pass uses, dS the dK pass uses, P the dV pass uses)."""
        return ds, ds, p


class BwdWindowDkvTileRange(Bwd):
    """Sliding-window backward, dK/dV kernel (128-key blocks, 128-row query tiles): the last query tile
    that can see key block n is computed from the block's FIRST key (n*BN - off + left) // BM instead of its
    last ((n+1)*BN - 1 - off + left) // BM: the rows of the next tile drop out of dK, dV of the block's
    last keys.  dQ right.  Class: flash-attention local (window) backward m_block range,
    cf. Dao-AILab/flash-attention#1199-style local-attn bwd bugs."""

    name = "broken-bwd-window-dkv-tile-range"
    capabilities = _caps(("float32",), ("window", "causal_bottom_right"), gradients=True)

    def _parts(self, call, ds, p, env):
        if call.window is None or call.window[0] is None:
            return ds, ds, p
        Lq, Lk = p.shape[-2:]
        off, left = self._offset(call, Lq, Lk, "window"), call.window[0]
        i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
        keep = (i // self.BM) <= ((j // self.BN) * self.BN - off + left) // self.BM  # the slip: block's first key
        return ds, np.where(keep, ds, 0), np.where(keep, p, 0)


class BwdWindowGqaDqPackedRow(Bwd):
    """Pack-GQA dQ kernel (the g query heads of a KV head packed on the row axis, 64-row tiles, 64-key blocks):
    a tile's first key block under a window is found from the tile's first PACKED row (m*64) taken as a
    query index, not m*64 // g: keys the tile's rows see before that block are left out of dQ.
    dK, dV right.  Class: FA3 pack_gqa + local (window) index mix-ups."""

    name = "broken-bwd-window-gqa-dq-packed-row"
    capabilities = _caps(("float64",), ("window", "gqa"), gradients=True)
    BM = BN = 64

    def _parts(self, call, ds, p, env):
        Hq, Hkv = env["q"].shape[-3], env["k"].shape[-3]
        if call.window is None or call.window[0] is None or not call.enable_gqa or Hq == Hkv:
            return ds, ds, p
        g = Hq // Hkv
        Lq, Lk = p.shape[-2:]
        off, left = self._offset(call, Lq, Lk, "window"), call.window[0]
        hh = (np.arange(Hq) % g)[:, None]  # (Hq, 1)
        r = np.arange(Lq)[None, :] * g + hh  # (Hq, Lq) the packed row
        first = (r // self.BM) * self.BM  # the slip: a packed row count used as a query index
        n_min = np.maximum(0, (first + off - left) // self.BN) * self.BN  # (Hq, Lq)
        keep = np.arange(Lk)[None, None, :] >= n_min[..., None]  # (Hq, Lq, Lk)
        return np.where(keep, ds, 0), ds, p


class DbiasQueryBroadcastLastTile(Bwd):
    """dBias of a bias broadcast over queries ((B, 1, 1, Lk), (1, H, 1, Lk)): each 128-row query tile stores
    its partial row sum to the one dBias row (a store, not an atomic add): the last tile wins.  Right with
    Lq <= 128.  Class: Triton flash dbias for broadcast biases (tl.store instead of tl.atomic_add)."""

    name = "broken-dbias-query-broadcast-last-tile"
    capabilities = _caps(("float32",), ("bias",), gradients=True, bias_gradient=True)

    def _dbias(self, ds, call):
        shape, Lq = call.bias.shape, ds.shape[-2]
        if len(shape) >= 2 and shape[-2] == 1 and Lq > self.BM:
            t0 = (Lq - 1) // self.BM * self.BM
            return sum_to(ds[..., t0:, :], shape)  # the slip: the last tile's rows only
        return sum_to(ds, shape)


class DbiasBatchBroadcastLastBatch(Bwd):
    """dBias of a bias broadcast over the batch ((Lq, Lk), (1, H, ., Lk)): one program per batch element
    stores its dBias (no reduction over the batch): the last batch element's wins."""

    name = "broken-dbias-batch-broadcast-last-batch"
    capabilities = _caps(("float64",), ("bias",), gradients=True, bias_gradient=True)

    def _dbias(self, ds, call):
        shape, B = call.bias.shape, ds.shape[0]
        if B > 1 and (len(shape) < 4 or shape[0] == 1):
            return sum_to(ds[-1:] if len(shape) == 4 else ds[-1], shape)  # the slip
        return sum_to(ds, shape)


class BwdKeyLengthsTailBlock(Bwd):
    """Backward with key lengths: the dK/dV kernel iterates key blocks up to cdiv(kv_len, 128) and applies
    the length mask only in block 0; in a tail block n >= 1 the padded keys get P = exp(S - LSE) from the
    stored LSE, so their dK, dV are not 0.  Right while kv_len <= 128.  Class: flash bwd Is_even_N
    masking; pytorch#176793-style nonzero gradients on padding."""

    name = "broken-bwd-key-lengths-tail-block"
    capabilities = _caps(("float32",), ("seq_lengths",), gradients=True)

    def _parts(self, call, ds, p, env):
        if call.kv_lengths is None:
            return ds, ds, p
        Lq, Lk = p.shape[-2:]
        kv = np.asarray(call.kv_lengths).reshape(-1)[:, None, None, None]  # (B, 1, 1, 1)
        j = np.arange(Lk)
        tail = (j >= kv) & (j < -(-kv // self.BN) * self.BN) & (j >= self.BN)  # (B, 1, 1, Lk)
        if not tail.any():
            return ds, ds, p
        s2, _, _ = self.scores(env["q"], env["k"], replace(call, kv_lengths=None))  # keys zeroed: q.0 = 0
        lse = env["lse"][..., None]
        with np.errstate(invalid="ignore", over="ignore"):
            pe = np.where(tail & np.isfinite(s2) & np.isfinite(lse), np.exp(s2 - np.where(np.isfinite(lse), lse, 0)), 0)
        dse = pe * (env["dp"] - env["D"])
        return ds, ds + dse, p + pe


class BwdAlibiKeyBlockRelative(Bwd):
    """ALiBi in the backward's recompute: in key blocks n >= 1 (128 keys) the distance takes the key's
    index within the block (j - n*128) - the forward uses the absolute one.  P = exp(S - LSE) is then wrong
    past key 127 in all of dQ, dK, dV.  Class: ALiBi column offset in a tiled backward (FA2 alibi bwd)."""

    name = "broken-bwd-alibi-key-block-relative"
    capabilities = _caps(("bfloat16",), ("alibi", "causal_bottom_right"), gradients=True)

    def _parts(self, call, ds, p, env):
        Lq, Lk = p.shape[-2:]
        if call.alibi_slopes is None or Lk <= self.BN:
            return ds, ds, p
        o = Lk - Lq if call.causal_alignment == "bottom_right" else 0
        i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
        slopes = np.asarray(call.alibi_slopes, dtype=np.float64)[..., None, None]  # (..., Hq, 1, 1)
        delta = slopes * (np.abs(i + o - j) - np.abs(i + o - j % self.BN))  # the slip's change of S
        s = env["s"] + delta.astype(env["s"].dtype)
        lse = env["lse"][..., None]
        with np.errstate(invalid="ignore", over="ignore"):
            pb = np.where(np.isfinite(s) & np.isfinite(lse), np.exp(s - np.where(np.isfinite(lse), lse, 0)), 0)
        dsb = pb * (env["dp"] - env["D"])
        return dsb, dsb, pb


class BwdSegmentsTileSkip(Bwd):
    """Segment ids in the backward: a (128-row query tile, 128-key block) pair is skipped unless the segment
    of the tile's FIRST row lies within the block's segments - not the tile's whole range: rows of a later
    segment in the tile lose the keys of their segment's next block.  Right at one tile and one block."""

    name = "broken-bwd-segments-tile-skip"
    capabilities = _caps(("float64",), ("segment_ids",), gradients=True)

    def _parts(self, call, ds, p, env):
        Lq, Lk = p.shape[-2:]
        if call.q_segment_ids is None or (Lq <= self.BM and Lk <= self.BN):
            return ds, ds, p
        qs = np.asarray(call.q_segment_ids)  # (B, Lq)
        ks = np.asarray(call.kv_segment_ids)  # (B, Lk)
        i, j = np.arange(Lq), np.arange(Lk)
        qf = qs[..., (i // self.BM) * self.BM]  # (B, Lq) the tile's first row's segment
        kf = ks[..., (j // self.BN) * self.BN]  # (B, Lk)
        kl = ks[..., np.minimum((j // self.BN + 1) * self.BN, Lk) - 1]
        keep = (kf[..., None, :] <= qf[..., :, None]) & (qf[..., :, None] <= kl[..., None, :])  # (B, Lq, Lk)
        keep = keep[..., None, :, :]  # (B, 1, Lq, Lk)
        return np.where(keep, ds, 0), np.where(keep, ds, 0), np.where(keep, p, 0)


class BwdSoftcapDkLaterBlocks(Bwd):
    """Softcap backward, dK/dV kernel: the (1 - tanh^2) factor is applied in the first key block's masking
    iteration only; in key blocks n >= 1 (128 keys) dK gets dS without it.  dQ right.  Class: softcap bwd
    in flash-attention 2.6 (Gemma-2), the dtanh applied on one code path only."""

    name = "broken-bwd-softcap-dk-later-blocks"
    capabilities = _caps(("float16",), ("softcap",), gradients=True)

    def _parts(self, call, ds, p, env):
        Lk = p.shape[-1]
        if env["fac"] is None or Lk <= self.BN:
            return ds, ds, p
        raw = p * (env["dp"] - env["D"])  # dS before the cap's factor
        later = np.arange(Lk) >= self.BN
        return ds, np.where(later, raw, ds), p


class BwdSinksDsinkFirstTile(SinkKernel):
    """dSink = -sum over rows of p_sink * D, accumulated per 128-row query tile: only the first tile's
    partial reaches dSink (the others' atomic add missing).  dQ, dK, dV right; right with Lq <= 128.
    Class: attention-sink backward (gpt-oss, FA3 / FlashInfer sink bwd) per-tile reduction."""

    name = "broken-bwd-sinks-dsink-first-tile"
    capabilities = replace(SinkKernel.capabilities, dtypes=("float32",))

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        Lq = q.shape[-2]
        if call.sinks is None or Lq <= 128:
            return grads
        mask = call.mask
        if mask is not None and np.ndim(mask) >= 2 and np.shape(mask)[-2] == Lq:
            mask = np.asarray(mask)[..., :128, :]
        first = super().native_attention_backward(q[..., :128, :], k, v, grad_out[..., :128, :],
                                                  replace(call, mask=mask))
        return grads[:-1] + (first[-1],)  # the slip
