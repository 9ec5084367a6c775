"""Slips a twelfth review wrote where a kernel's tables, packs and shortcuts meet sizes and forms the draws
never gave: per-head sinks or ALiBi slopes kept in a 32-entry table (gpt-oss-120b: 64 heads; BLOOM: 112), a
pack of at most 8 query heads a KV head (Llama-3.1-405B: groups of 16), a split-KV buffer sized for 2048 keys,
a launch heuristic whose large-grid kernel has no softcap, a token-to-sequence map that counts a repeated
cu_seqlens boundary once, a row that sees only its sink returning an LSE of -inf, a self-attention shortcut
that unpads the keys by the queries' lengths, segment ids read as key spans, and a (1, H, Lq, Lk) bias read
at head 0.  Each is numpy-naive (correct in every format it declares) with one slip; the suite reaches each
by construction (test_edges.py's `_wide_rows`, serving_calls.edge_cases' repeated boundaries, the sink-only
rows judged by test_sinks.lse_as_declared).  And one found after: a NaN-declared kernel writing NaN where a row
sees only its sink (the edge grid's sink-only rows now judged whatever fully_masked says).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends import numpy_formats
from attnspec.backends.numpy_backends import NumpyNaive

_DTYPES = ("float32", "float64")


class _CallSlip(NumpyNaive):
    """Forward-only numpy-naive whose inputs pass through `_slip` first."""

    capabilities = replace(NumpyNaive.capabilities, dtypes=_DTYPES, gradients=False)

    def _slip(self, q, k, v, call):
        return q, k, v, call

    def native_attention(self, q, k, v, call):
        return super().native_attention(*self._slip(q, k, v, call))


class SinksHeadTable32(_CallSlip):
    """Sinks staged in a 32-entry table (sized for 32 query heads): query head h reads sinks[h % 32]."""

    name = "broken-sinks-head-table-32"

    def _slip(self, q, k, v, call):
        if call.sinks is not None and np.size(call.sinks) > 32:
            s = np.asarray(call.sinks)
            call = replace(call, sinks=s[np.arange(s.size) % 32])  # the slip
        return q, k, v, call


class AlibiHeadTable32(_CallSlip):
    """ALiBi slopes staged in a 32-entry constant table: head h reads slopes[h % 32]."""

    name = "broken-alibi-head-table-32"

    def _slip(self, q, k, v, call):
        if call.alibi_slopes is not None and np.size(call.alibi_slopes) > 32:
            s = np.asarray(call.alibi_slopes)
            call = replace(call, alibi_slopes=s[np.arange(s.size) % 32])  # the slip
        return q, k, v, call


class GqaPackOf8(_CallSlip):
    """A pack-GQA kernel whose head pack holds at most 8 query heads: KV head = min(h // min(g, 8), Hkv - 1)
    (right for groups of 8 or fewer, and for one KV head)."""

    name = "broken-gqa-pack-of-8"

    def _slip(self, q, k, v, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        g = Hq // Hkv
        if call.enable_gqa and g > 8:
            idx = np.minimum(np.arange(Hq) // 8, Hkv - 1)  # the slip: h // 8, not h // g
            k, v = k[..., idx, :, :], v[..., idx, :, :]  # (..., Hq, Lk, E), (..., Hq, Lk, Ev)
            call = replace(call, enable_gqa=False)
        return q, k, v, call


class DecodeSplitsCapped2048(_CallSlip):
    """A split-KV decode (Lq <= 16) whose partition buffer is sized for 2048 keys (8 partitions of 256): the
    partitions past it never launch, keys 2048 and up are never read (vLLM paged_attention_v2's max_seq_len)."""

    name = "broken-decode-splits-capped-2048"

    def _slip(self, q, k, v, call):
        Lq, Lk = q.shape[-2], k.shape[-2]
        if Lq <= 16 and Lk > 2048:
            seen = np.broadcast_to(np.arange(Lk) < 2048, (Lq, Lk))  # (Lq, Lk) the slip
            call = replace(call, mask=seen if call.mask is None else np.logical_and(call.mask, seen))
        return q, k, v, call


class LargeLaunchDropsSoftcap(_CallSlip):
    """FA2's split heuristic: from B * Hq * ceil(Lq / 64) >= 106 work items (0.8 x an H100's 132 SMs) one split,
    another kernel instantiation, built without the softcap; the small launches right."""

    name = "broken-large-launch-drops-softcap"

    def _slip(self, q, k, v, call):
        B = int(np.prod(q.shape[:-3]))
        if call.softcap is not None and B * q.shape[-3] * -(-q.shape[-2] // 64) >= 106:
            call = replace(call, softcap=None)  # the slip
        return q, k, v, call


class PackedBoundaryCountedOnce(NumpyNaive):
    """A packed call's token-to-sequence map from boundary marks and a prefix sum, the marks written by a
    plain indexed store (`marks[cu[1:-1]] += 1`, not np.add.at or an atomic): a boundary cu_seqlens repeats (a
    sequence with no queries between others, or two leading) counts once, later tokens land a sequence early."""

    name = "broken-packed-boundary-counted-once"
    capabilities = replace(NumpyNaive.capabilities, dtypes=_DTYPES)

    def native_packed(self, q, k, v, args, call):
        cu = np.asarray(args.cu_seqlens_q, np.int64)
        B, total = cu.size - 1, int(cu[-1])
        marks = np.zeros(total + 1, np.int64)
        marks[cu[1:-1]] += 1  # the slip: a repeated index is written once
        seq = np.cumsum(marks)[:total]  # (total_q,) each token's sequence
        counts = np.bincount(seq, minlength=B)[:B]
        cu_q = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        args = replace(args, cu_seqlens_q=cu_q, max_seqlen_q=max(int(counts.max(initial=0)), 1))
        return numpy_formats.gathered_packed(self, q, k, v, args, call)


class SinkOnlyRowLseMinusInf(_CallSlip):
    """A row that sees no key exits early: its output 0 (right: all its weight on the sink) but its LSE -inf,
    the sink never folded in (it is s_h; flash-attention#1778's early exit)."""

    name = "broken-sink-only-row-lse-minus-inf"

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        if not call.return_lse or call.sinks is None:
            return y
        out, lse = y
        _, bare = super().native_attention(q, k, v, replace(call, sinks=None))  # the LSE over the keys alone
        return out, np.where(np.isneginf(bare), -np.inf, lse)  # the slip


class KeyLengthsFromQueryLengths(_CallSlip):
    """A self-attention shortcut (Hugging Face's `_upad_input` reuses one side's unpadding when the query
    length equals the key length): with Lq = Lk and only q_lengths given, the keys are cut to q_lengths too."""

    name = "broken-key-lengths-from-query-lengths"

    def _slip(self, q, k, v, call):
        if call.q_lengths is not None and call.kv_lengths is None and q.shape[-2] == k.shape[-2]:
            call = replace(call, kv_lengths=np.asarray(call.q_lengths))  # the slip
        return q, k, v, call


class SegmentsAsKeySpans(_CallSlip):
    """Segment ids turned into key spans (block-sparse document masking): query i sees keys first..last where
    its id occurs on the key side; right while each id is one run, an id that comes back lets the keys between
    through."""

    name = "broken-segments-as-key-spans"

    def _slip(self, q, k, v, call):
        if call.q_segment_ids is None:
            return q, k, v, call
        qs, ks = np.asarray(call.q_segment_ids), np.asarray(call.kv_segment_ids)  # (..., Lq), (..., Lk)
        j = np.arange(ks.shape[-1])
        same = qs[..., :, None] == ks[..., None, :]  # (..., Lq, Lk)
        first = np.where(same, j, ks.shape[-1]).min(axis=-1, keepdims=True)  # (..., Lq, 1)
        last = np.where(same, j, -1).max(axis=-1, keepdims=True)  # (..., Lq, 1)
        span = ((j >= first) & (j <= last))[..., None, :, :]  # (..., 1, Lq, Lk) the slip: the span, not the ids
        mask = span if call.mask is None else np.logical_and(call.mask, span)
        return q, k, v, replace(call, q_segment_ids=None, kv_segment_ids=None, mask=mask)


class BiasBatchOneReadAtHead0(_CallSlip):
    """A (1, H, Lq, Lk) bias (one relative-position bias for every sequence) expanded with the batch axis's
    stride 0 copied to the head axis too: every head reads head 0's rows."""

    name = "broken-bias-batch-one-read-at-head-0"

    def _slip(self, q, k, v, call):
        b = call.bias
        if b is not None and np.ndim(b) == 4 and b.shape[0] == 1 and b.shape[1] > 1 and b.shape[2] > 1:
            call = replace(call, bias=np.broadcast_to(b[:, :1], b.shape))  # (1, H, Lq, Lk) the slip
        return q, k, v, call


class SinkOnlyRowNaN(_CallSlip):
    """Declares a fully masked row NaN (as OpenVINO's SDPA gives it) and treats a row that sees no key as fully
    masked even beside a finite sink: NaN there, where the sink takes all the weight and the output is 0."""

    name = "broken-sink-only-row-nan"
    semantics = replace(NumpyNaive.semantics, fully_masked="nan")

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        out, lse = y if call.return_lse else (y, None)
        _, bare = super().native_attention(q, k, v, replace(call, sinks=None, return_lse=True))  # the keys alone
        Lq = out.shape[-2]
        real = np.arange(Lq) < (Lq if call.q_lengths is None else np.asarray(call.q_lengths)[..., None, None])
        out = np.where((np.isneginf(bare) & real)[..., None], np.nan, out)  # the slip: the sink not counted
        return (out, lse) if call.return_lse else out
