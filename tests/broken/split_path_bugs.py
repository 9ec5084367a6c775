"""Slips a fifth review wrote on split-KV and serving paths past what the grids built before: a packed
split-KV combine that places a sequence's partials by max_seqlen_q, a paged chunk of 2..16 queries sent to a
decode kernel without causal, a long paged decode's window masked in the last partition only, its ALiBi
off by the left padding, the sink folded at key block 0 under a window, a split path with two fields (a
softcap with ALiBi, a window or sinks under grouped heads), fp8's v_descale applied twice on a split path.
Each is a correct kernel with one slip; the suite reaches each by construction (the edge grids of
properties/test_edges.py, serving_calls.py and test_paged.py; test_fp8.py's split-KV descales).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends import numpy_formats
from attnspec.backends.numpy_backends import NumpyNaive
from attnspec.specs.formats import gather_paged

from ._kernels import numpy_caps
from ._variants import VariantKernel
from .fp8_bugs import Fp8Kernel
from .path_bugs import SPLIT_KEYS as SPLIT_K
from .path_bugs import SPLIT_QUERIES as SPLIT_Q
from .path_bugs import _split_kv

_SERVE = frozenset({"seq_lengths", "seq_positions", "causal_bottom_right"})


def _caps(dtypes, features):
    return numpy_caps(*dtypes, features=features)


class PackedSplitKvRowOffset(NumpyNaive):
    """Varlen split-KV path (max_seqlen_q <= 16, max_seqlen_k >= 512): the partial outputs are written at
    each row's packed token index cu_seqlens_q[b] + i, but the combine reads them at the padded index
    b * max_seqlen_q + i.  Right when every sequence has max_seqlen_q queries (decode batches).
    Class: FA3 varlen + num_splits combine indexing (flash-attention varlen split-KV; seqlen_q > 1 spec-decode)."""

    name = "broken-packed-split-kv-row-offset"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float64",), features=_SERVE | {"lse"},
                           formats=("padded", "packed"))

    def native_packed(self, q, k, v, args, call):
        y = numpy_formats.gathered_packed(self, q, k, v, args, call)
        if not (args.max_seqlen_q <= SPLIT_Q and args.max_seqlen_k >= SPLIT_K):
            return y
        out, lse = y if call.return_lse else (y, None)
        cu_q = np.asarray(args.cu_seqlens_q, np.int64)
        n_real, mq = int(cu_q[-1]), int(args.max_seqlen_q)
        o2 = out.copy()
        l2 = None if lse is None else lse.copy()
        for b in range(cu_q.size - 1):
            for i in range(int(cu_q[b + 1] - cu_q[b])):
                src = b * mq + i  # the slip: the padded index
                o2[cu_q[b] + i] = out[src] if src < n_real else np.nan
                if l2 is not None:
                    l2[:, cu_q[b] + i] = lse[:, src] if src < n_real else np.nan
        return (o2, l2) if call.return_lse else o2


class _Paged(NumpyNaive):
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float32",), features=_SERVE,
                           formats=("padded", "paged-NHD"))


class PagedSpecDecodeNoCausal(_Paged):
    """Paged call with 2..16 queries against a cache of 512 keys or more (speculative decoding, MTP) is sent
    to the split-KV decode kernel, which treats every query as the newest token: causal among the new
    tokens dropped.  Class: vLLM spec-decode through a decode-only kernel (FlashInfer decode for q_len > 1)."""

    name = "broken-paged-spec-decode-no-causal"

    def native_paged(self, q, k_cache, v_cache, args, call):
        lens = np.asarray(args.cache_seqlens, np.int64)
        if call.is_causal and 1 < q.shape[2] <= SPLIT_Q and lens.max(initial=0) >= SPLIT_K:
            call = replace(call, is_causal=False)  # the slip
        return numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)


class PagedLongDecodeWindowPartition(_Paged):
    """Multi-partition paged decode (one query, a cache past 512 keys, 512-key partitions): partitions
    wholly left of the window are skipped, but the first partition read is not masked at the window's edge:
    its keys before the edge are seen.  Class: sliding window in vLLM paged_attention_v2 / split-KV decode
    (partition-level window skipping, vllm#3385's neighbourhood)."""

    name = "broken-paged-long-decode-window-partition"
    capabilities = replace(_Paged.capabilities, features=_SERVE | {"window"})

    def native_paged(self, q, k_cache, v_cache, args, call):
        lens = np.asarray(args.cache_seqlens, np.int64)
        if not (q.shape[2] == 1 and call.window is not None and call.window[0] is not None
                and call.causal_alignment == "bottom_right" and lens.max(initial=0) > SPLIT_K):
            return numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)
        left = call.window[0]
        Lk = int(lens.max())
        k, v = gather_paged(k_cache, v_cache, args.block_table, lens, args.layout, Lk=Lk)
        edge = lens - 1 - left  # (B,) the window's first key
        lo = np.where(lens > SPLIT_K, np.maximum(edge, 0) // SPLIT_K * SPLIT_K, edge)  # the slip: partition start
        j = np.arange(Lk)
        vis = (j[None, :] >= lo[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
        right = call.window[1]
        if right is not None:
            vis = vis & (j[None, :] <= (lens - 1 + right)[:, None])[:, None, None, :]
        call2 = replace(call, window=None, mask=vis, positions="per_sequence", kv_lengths=lens,
                        kv_starts=args.cache_leftpad)
        return self.native_attention(q, k, v, call2)


class PagedLongDecodeAlibiLeftpad(_Paged):
    """Multi-partition paged decode (one query, a cache past 512 keys) with cache_leftpad: ALiBi's query
    position taken as cache_seqlens - 1 - cache_leftpad (the sequence's own length) while keys are at their
    slot index: every distance off by the left padding.  Class: FA kvcache cache_leftpad + alibi
    (flash-attention#1788's neighbourhood) on vLLM v2's launch."""

    name = "broken-paged-long-decode-alibi-leftpad"
    capabilities = replace(_Paged.capabilities, features=_SERVE | {"alibi"})

    def native_paged(self, q, k_cache, v_cache, args, call):
        lens = np.asarray(args.cache_seqlens, np.int64)
        if not (q.shape[2] == 1 and call.alibi_slopes is not None and args.cache_leftpad is not None
                and call.causal_alignment == "bottom_right" and lens.max(initial=0) > SPLIT_K):
            return numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)
        pads = np.asarray(args.cache_leftpad, np.int64)
        Lk = int(lens.max())
        k, v = gather_paged(k_cache, v_cache, args.block_table, lens, args.layout, Lk=Lk)
        qpos = (lens - 1 - pads)[:, None, None, None]  # the slip: minus the padding
        slopes = np.asarray(call.alibi_slopes, np.float64)
        slopes = slopes.reshape((-1, q.shape[1], 1, 1)) if slopes.ndim == 2 else slopes[:, None, None]
        bias = -slopes * np.abs(qpos - np.arange(Lk)[None, None, None, :])  # (B, Hq, 1, Lk)
        call2 = replace(call, alibi_slopes=None, bias=bias.astype(q.dtype), positions="per_sequence",
                        kv_lengths=lens, kv_starts=args.cache_leftpad)
        return self.native_attention(q, k, v, call2)


class SinksWindowFirstBlockFold(NumpyNaive):
    """The sink folded into the online softmax at key block 0 (64-key blocks, 64-row tiles); with a sliding
    window a query tile whose first key block is past 0 never visits block 0 and its rows get no sink.
    Class: sink as the first iteration's initial state (gpt-oss Triton / FA3 sinks + local)."""

    name = "broken-sinks-window-first-block-fold"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float32",), gradients=False,
                           features=frozenset({"sinks", "window", "causal_bottom_right"}), formats=("padded",))

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        if call.sinks is None or call.window is None or call.window[0] is None:
            return y
        Lq, Lk = q.shape[-2], k.shape[-2]
        off = Lk - Lq if call.causal_alignment == "bottom_right" else 0
        m = np.arange(Lq) // 64
        n_min = np.maximum(0, (m * 64 + off - call.window[0]) // 64)  # (Lq,)
        rows = n_min > 0
        if not rows.any():
            return y
        y0 = super().native_attention(q, k, v, replace(call, sinks=None))  # the slip on those rows
        if call.return_lse:
            (o, lse), (o0, lse0) = y, y0
            return np.where(rows[:, None], o0, o), np.where(rows, lse0, lse)
        return np.where(rows[:, None], y0, y)


class SplitKvSoftcapAlibiOrder(VariantKernel):
    """The split-KV decode path (<= 16 queries, >= 512 keys) with both a softcap and ALiBi adds ALiBi before
    the cap (cap * tanh((s + alibi) / cap)); the prefill path caps first.  Class: AlibiBeforeSoftcap
    (flash-attention#1025's order question) on a split path with two fields."""

    name = "broken-split-kv-softcap-alibi-order"
    capabilities = _caps(("float16",), ("softcap", "alibi", "causal_bottom_right"))

    def scores(self, q, k, call):
        if not (_split_kv(q, k) and call.softcap is not None and call.alibi_slopes is not None):
            return super().scores(q, k, call)
        s0, vis, _ = super().scores(q, k, replace(call, softcap=None))  # raw + alibi, hidden at -inf
        cap = s0.dtype.type(call.softcap)
        t = np.tanh(np.where(vis, s0, 0) / cap)
        return np.where(vis, cap * t, -np.inf), vis, t  # the slip: the cap over raw + alibi


class SplitKvGqaWindowPackedRow(VariantKernel):
    """The split-KV decode path with grouped heads packs the group's query heads on the row axis
    (row r = i * g + h % g) and measures the window from r, not from i.  Class: FA3 pack_gqa + local
    window on the decode path."""

    name = "broken-split-kv-gqa-window-packed-row"
    capabilities = _caps(("float64",), ("gqa", "window", "causal_bottom_right"))

    def native_attention(self, q, k, v, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if not (_split_kv(q, k) and call.window is not None and call.enable_gqa and Hq != Hkv):
            return super().native_attention(q, k, v, call)
        g = Hq // Hkv
        Lq, Lk = q.shape[-2], k.shape[-2]
        off = self._offset(call, Lq, Lk, "window")
        r = np.arange(Lq)[None, :] * g + (np.arange(Hq) % g)[:, None]  # (Hq, Lq) the slip
        d = np.arange(Lk)[None, None, :] - r[..., None] - off  # (Hq, Lq, Lk)
        left, right = call.window
        vis = np.ones(d.shape, dtype=bool)
        if left is not None:
            vis &= d >= -left
        if right is not None:
            vis &= d <= right
        mask = vis if call.mask is None else vis & np.asarray(call.mask, dtype=bool)
        return super().native_attention(q, k, v, replace(call, window=None, mask=mask))


class SplitKvSinksGqaKvHead(NumpyNaive):
    """The split-KV decode path (<= 16 queries, >= 512 keys) with grouped heads packs a KV head's query heads
    into one program and reads the sink at the program's head index (the KV head's, sinks[h // g]); the
    prefill path reads sinks[h].  Class: SinkByKvHead (vllm#52148's sink plumbing) on FA3's pack-GQA decode."""

    name = "broken-split-kv-sinks-gqa-kv-head"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float32",), gradients=False,
                           features=frozenset({"sinks", "gqa", "lse"}), formats=("padded",))

    def native_attention(self, q, k, v, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if _split_kv(q, k) and call.sinks is not None and call.enable_gqa and Hq != Hkv:
            s = np.asarray(call.sinks)
            call = replace(call, sinks=s[np.arange(Hq) // (Hq // Hkv)])  # the slip
        return super().native_attention(q, k, v, call)


class Fp8SplitKvVDescaleTwice(Fp8Kernel):
    """FA3's fp8 forward on its split-KV path (<= 16 queries, >= 512 keys): v_descale applied to each split's
    partial output and again after the combine.  Class: fp8 descales on FA3's split path
    (vllm-project/vllm#51363's neighbourhood)."""

    name = "broken-fp8-split-kv-v-descale-twice"
    capabilities = Fp8Kernel.capabilities

    def native_attention(self, q, k, v, call):
        out = super().native_attention(q, k, v, call)
        if not (_split_kv(q, k) and call.v_descale is not None):
            return out
        B, Hq, Hkv = q.shape[0], q.shape[1], k.shape[1]
        dv = np.repeat(self._descale(call.v_descale, B, Hkv), Hq // Hkv, axis=1)[..., None, None]
        return (np.asarray(out, dtype=np.float32) * dv).astype(out.dtype)  # the slip: twice
