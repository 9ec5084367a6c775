"""Slips a sixth review wrote where a kernel addresses what it is given by a stride or a ratio of its own: a
decode's KV head by a shift (groups of 3), a group of more than 8 query heads, an MQA cache read with batch
stride 0, a mask or bias broadcast over heads, the batch or queries read with the wrong stride, the backward's
tail columns at head dims no multiple of 8, its query loop under causal top-left with Lq > Lk, a pack-GQA
backward storing per 8-head tile, a num_splits knob that drops the last Lk mod n keys.  Each is a correct
kernel with one slip; the suite reaches each by construction (properties/test_edges.py's grid, the backward
grid of test_gradients.py, test_knobs.py's split-path settings).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._kernels import numpy_caps
from ._variants import VariantKernel
from .path_bugs import SPLIT_KEYS as SPLIT_K
from .path_bugs import SPLIT_QUERIES as SPLIT_Q


def _caps(dtypes, features, gradients=False, **more):
    c = numpy_caps(*dtypes, gradients=gradients, features=features)
    return replace(c, **more) if more else c


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _split_lse(res, call):
    return res if call.return_lse else (res, None)


def _join(out, lse, call):
    return (out, lse) if call.return_lse else out


class DecodeGqaShiftGroup(VariantKernel):
    """Decode kernel (Lq == 1) maps query head h to KV head h >> ceil(log2(group)) - a shift that is h // group
    only for power-of-two groups (a launcher that rounds the group to its tile, 2^k rows of a 16-row MMA).
    Groups 3, 5, 6, 7 with two or more KV heads read the wrong KV head.  Class: onnxruntime#29046 (XQA group
    sizes: first non-power-of-2 group 5 'leaves 3 unused rows'), FlashInfer decode group-size dispatch."""

    name = "broken-decode-gqa-shift-group"
    capabilities = _caps(("float32",), ("gqa", "lse"))

    def native_attention(self, q, k, v, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if q.shape[-2] == 1 and call.enable_gqa and Hkv > 1 and Hq != Hkv and not _pow2(Hq // Hkv):
            g = Hq // Hkv
            heads = np.minimum(np.arange(Hq) >> int(np.ceil(np.log2(g))), Hkv - 1)  # the slip
            k, v = np.take(k, heads, axis=-3), np.take(v, heads, axis=-3)
            call = replace(call, enable_gqa=False)
        return super().native_attention(q, k, v, call)


class DecodeGqaGroupOver8(VariantKernel):
    """Split/decode kernel with the group's query heads packed on a 16-row MMA tile's rows: the epilogue
    stores only row slot 0 (packed rows 0..7), so for a group larger than 8 query heads 8..group-1 of every
    KV group are never stored (torch.empty: NaN).  Decode only (Lq == 1).  Class: local-inference-lab/b12x#24
    ('dropped MMA row_slot 1 in decode-graph epilogues for gqa_group_size > 8', MiniMax 64/4)."""

    name = "broken-decode-gqa-group-over-8"
    capabilities = _caps(("bfloat16",), ("gqa", "lse"))

    def native_attention(self, q, k, v, call):
        res = super().native_attention(q, k, v, call)
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if not (q.shape[-2] == 1 and call.enable_gqa and Hq // Hkv > 8):
            return res
        out, lse = _split_lse(res, call)
        out = out.copy()
        out[..., np.arange(Hq) % (Hq // Hkv) >= 8, :, :] = np.nan  # the slip: row slot 1 never stored
        return _join(out, lse, call)


class MqaDecodeBatchZero(VariantKernel):
    """MQA decode (one KV head, Lq == 1): the kernel views K/V (B, 1, Lk, E) as (Lk, E) expanded over batch
    and heads (the 'num_kv_heads == 1' fast path that sets both the head and the batch stride to 0): every
    sequence of a batch reads sequence 0's keys and values.  Class: MQA num_kv_heads=1 stride bugs
    (pytorch#191937 stride-0 K/V; vLLM MQA expand paths)."""

    name = "broken-mqa-decode-batch-zero"
    capabilities = _caps(("float32",), ("gqa", "lse", "seq_lengths"))

    def native_attention(self, q, k, v, call):
        if q.shape[-2] == 1 and k.shape[-3] == 1 and q.shape[-3] > 1 and k.shape[0] > 1:
            k, v = np.broadcast_to(k[:1], k.shape), np.broadcast_to(v[:1], v.shape)  # the slip: batch stride 0
        return super().native_attention(q, k, v, call)


class MaskHeadBroadcastAsKeyPadding(VariantKernel):
    """A boolean mask broadcast over heads but not queries, (B, 1, Lq, Lk) (HF's expanded 4-D causal+padding
    mask), taken by the dispatcher's key-padding fast path because its head dim is 1 (with H > 1): only query
    row 0 of it is read, for every row.  Class: xformers#1089 / SDPA mask-broadcast confusion (a (B,1,Lq,Lk)
    mask treated as a (B,1,1,Lk) key-padding mask)."""

    name = "broken-mask-head-broadcast-as-key-padding"
    capabilities = _caps(("float16",), ())

    def native_attention(self, q, k, v, call):
        m = call.mask
        if m is not None and np.ndim(m) == 4 and m.shape[1] == 1 and m.shape[2] > 1 and q.shape[-3] > 1:
            call = replace(call, mask=np.ascontiguousarray(np.asarray(m)[:, :, :1, :]))  # the slip: row 0 only
        return super().native_attention(q, k, v, call)


class MaskBatchBroadcastHeadZero(VariantKernel):
    """A per-head boolean mask shared by the batch, (1, H, Lq, Lk), with B > 1: the kernel takes 'mask dim 0
    is 1' for 'the mask is broadcast' and sets both its batch and its head stride to 0: every head reads
    head 0's mask.  Class: attention mask broadcast strides (candle#1920 'avoid broadcasting on the batch
    dimension for the attention mask', pytorch#161310's mask batching)."""

    name = "broken-mask-batch-broadcast-head-zero"
    capabilities = _caps(("bfloat16",), ())

    def native_attention(self, q, k, v, call):
        m = call.mask
        if m is not None and np.ndim(m) == 4 and m.shape[0] == 1 and m.shape[1] > 1 and q.shape[0] > 1:
            call = replace(call, mask=np.ascontiguousarray(np.asarray(m)[:, :1]))  # the slip: head stride 0
        return super().native_attention(q, k, v, call)


class MaskQueryBroadcastDenseStride(VariantKernel):
    """A per-head key mask broadcast over queries, (B, H, 1, Lk), with Lq > 1: the kernel addresses it as a
    dense (B, H, Lq, Lk) buffer (query stride Lk): row i of (b, h) reads flat row b*H + h + i of the
    (B*H, Lk) buffer; past its end the read returns 1 (visible).  Class: flash-attention/triton bias and mask
    stride bugs ('attention mask broadcast wrong', pytorch#97514's mem-efficient mask path)."""

    name = "broken-mask-query-broadcast-dense-stride"
    capabilities = _caps(("float32",), ())

    def native_attention(self, q, k, v, call):
        m = call.mask
        Lq = q.shape[-2]
        if m is not None and np.ndim(m) == 4 and m.shape[2] == 1 and m.shape[1] > 1 and Lq > 1:
            B, H, _, Lk = np.shape(m)
            flat = np.asarray(m, dtype=bool).reshape(B * H, Lk)
            r = (np.arange(B * H)[:, None] + np.arange(Lq)[None, :])  # (B*H, Lq) the slip: dense query stride
            big = np.concatenate([flat, np.ones((Lq, Lk), dtype=bool)])
            call = replace(call, mask=big[r].reshape(B, H, Lq, Lk))
        return super().native_attention(q, k, v, call)


class BiasQueryBroadcastBatchZero(VariantKernel):
    """A float bias per sequence and head but broadcast over queries, (B, H, 1, Lk) (a per-head key bias:
    ALiBi-like position bias precomputed per sequence, or a padding bias with per-head scales), with B > 1:
    read with batch stride 0 (the stride of a broadcast dim copied onto the batch dim by the kernel's
    'bias has a broadcast dim' branch): every sequence gets sequence 0's bias.  Class: bias broadcast strides
    in fused attention (flash-attn triton bias, xformers attn_bias expand)."""

    name = "broken-bias-query-broadcast-batch-zero"
    capabilities = _caps(("float32",), ("bias",))

    def native_attention(self, q, k, v, call):
        b = call.bias
        if b is not None and np.ndim(b) == 4 and b.shape[0] > 1 and b.shape[1] > 1 and b.shape[2] == 1:
            call = replace(call, bias=np.ascontiguousarray(np.broadcast_to(np.asarray(b)[:1], b.shape)))  # slip
        return super().native_attention(q, k, v, call)


class BwdHeadDimTailColumns(VariantKernel):
    """Backward, head dims not multiple of 8 above 32 (59, 111, 72+odd): dK's store is vectorised in 8-column
    chunks with the column predicate dropped: the last E % 8 columns of dK are never written (0).  Forward
    and dQ, dV fine.  Class: 'head dim 96 / non-multiple-of-8 wrong' (flash-attn pads hdim to a multiple of
    8; a kernel that takes odd head dims natively and misses the tail predicate in one store)."""

    name = "broken-bwd-head-dim-tail-columns"
    capabilities = _caps(("float64",), (), gradients=True)

    def native_attention_backward(self, q, k, v, grad_out, call):
        dq, dk, dv = super().native_attention_backward(q, k, v, grad_out, call)[:3]
        E = q.shape[-1]
        if E > 32 and E % 8:
            dk = dk.copy()
            dk[..., E // 8 * 8:] = 0  # the slip
        return dq, dk, dv


class BwdCausalTopLeftRowsPastLk(VariantKernel):
    """Causal backward, top-left alignment with more queries than keys (Lq > Lk): the dK/dV kernel's query
    loop ends at cdiv(Lk, 128) * 128 rows (written for Lq <= Lk, where causal rows past the last key's
    diagonal see nothing new) - but top-left rows past Lk see every key: their dK, dV contributions are
    dropped.  dQ fine.  Class: causal Lq > Lk loop bounds in flash backward (flash-attention#951 alignment
    change, the top-left branch kept by PyTorch's mem-efficient backward)."""

    name = "broken-bwd-causal-top-left-rows-past-lk"
    capabilities = _caps(("float32",), (), gradients=True)
    BM = 128

    def native_attention_backward(self, q, k, v, grad_out, call):
        full = super().native_attention_backward(q, k, v, grad_out, call)
        Lq, Lk = q.shape[-2], k.shape[-2]
        if not (call.is_causal and call.causal_alignment != "bottom_right" and Lq > Lk):
            return full
        stop = -(-Lk // self.BM) * self.BM
        if Lq <= stop:
            return full
        g = np.array(grad_out, copy=True)
        g[..., stop:, :] = 0  # rows the dK/dV loop never reaches
        part = super().native_attention_backward(q, k, v, g, call)
        return (full[0], part[1], part[2]) + tuple(full[3:])


class BwdPackGqaTileStore(VariantKernel):
    """Pack-GQA backward for groups larger than 8: the group's query heads processed in tiles of 8, each
    tile's dK/dV partial sum written with a store, not an atomic add: the last tile's (heads 8..g-1) sum
    overwrites the first's.  Groups up to 8 (one tile) right.  Class: b12x#24-like row-slot handling on the
    backward; FA3 pack_gqa dK/dV accumulation (flash-attention#2528 group sums)."""

    name = "broken-bwd-pack-gqa-tile-store"
    capabilities = _caps(("float32",), ("gqa",), gradients=True)

    def _per_kv_head(self, g, shape, first_only=False):
        Hq, Hkv = g.shape[-3], shape[-3]
        if Hq // Hkv > 8:
            grouped = g.reshape(g.shape[:-3] + (Hkv, Hq // Hkv) + g.shape[-2:])
            g = grouped[..., 8:, :, :].sum(axis=-3)  # the slip: the last tile only
            from tests.broken._kernels import sum_to
            return sum_to(g, shape)
        return super()._per_kv_head(g, shape, first_only)


class KnobNumSplitsLongTail(VariantKernel):
    """A num_splits knob (FA3's) used only where the split heuristic lets it act: <= 16 queries against 512
    keys or more.  Each split holds Lk // num_splits keys: the last Lk % num_splits keys are dropped.  Short
    rows ignore the knob.  Class: split-KV tail (flash-attention num_splits; 'a split count that rounds down')."""

    name = "broken-knob-num-splits-long-tail"
    capabilities = _caps(("float32",), ("lse",))
    knobs = {"num_splits": (1, 2, 3, 7)}

    def native_attention(self, q, k, v, call):
        n = (call.knobs or {}).get("num_splits", 1)
        Lk = k.shape[-2]
        if n > 1 and q.shape[-2] <= SPLIT_Q and Lk >= SPLIT_K and Lk % n:
            keep = Lk // n * n
            vis = np.broadcast_to(np.arange(Lk) < keep, (q.shape[-2], Lk))
            m = vis if call.mask is None else np.asarray(call.mask, bool) & vis
            call = replace(call, mask=m)  # the slip: the tail past n * (Lk // n)
        return super().native_attention(q, k, v, call)
