"""Slips an eighth review wrote where positions, lengths and segment ids meet the other fields: a padded call
with per-sequence positions routed to a varlen kernel that has no mask, bias or segment argument; segment ids
found by binary search (sorted ids assumed); key lengths alone taken as a KV cache's own lengths (each sequence
aligned at its cache length); a window's diagonal offset clamped at 0 where there are more queries than keys;
a window measured from each packed document's start.  Each is numpy-naive with one slip, written as a rewrite
of the `Call` the correct kernel then runs.  The suite reaches each by construction (properties/test_packed.py's
`per_sequence_positions_keep_*`, the relabelled segment draws, properties/test_edges.py's key-lengths,
window-past-the-keys and segments-under-a-window rows).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive, _offset


def _caps():
    return replace(NumpyNaive.capabilities, dtypes=("float32", "float64"), gradients=False)


def _with_keep(call, keep):
    """The call with `keep` ((..., Lq, Lk) booleans, broadcast over heads) hiding keys through its bias."""
    hide = np.where(keep, 0.0, -np.inf)[..., None, :, :]  # (..., 1, Lq, Lk)
    bias = hide if call.bias is None else np.asarray(call.bias, dtype=np.float64) + hide
    return replace(call, bias=bias)


def _window_keep(d, window):
    """Keys within (left, right) of the diagonal, d = j - (i + o)."""
    left, right = window
    keep = np.ones(np.shape(d), dtype=bool)
    if left is not None:
        keep &= d >= -left
    if right is not None:
        keep &= d <= right
    return keep


class _Slip(NumpyNaive):
    capabilities = _caps()

    def slip(self, q, k, v, call):
        return call

    def native_attention(self, q, k, v, call):
        return super().native_attention(q, k, v, self.slip(q, k, v, call))


class PerSequenceDropsMaskBiasSegments(_Slip):
    """A padded call with per-sequence positions goes to a varlen kernel (flash_attn_varlen_func: cu_seqlens,
    causal, window, softcap, ALiBi; no mask, bias or segment argument): the mask, bias and segment ids are
    dropped.  As adapters that send packed position_ids inputs to the varlen path and lose the mask."""

    name = "broken-per-sequence-drops-mask-bias-segments"

    def slip(self, q, k, v, call):
        if call.positions != "per_sequence":
            return call
        return replace(call, mask=None, bias=None, q_segment_ids=None, kv_segment_ids=None)


class SegmentsFoundBySearch(_Slip):
    """A query's keys are the range of its segment id in kv_segment_ids, found by binary search (searchsorted),
    which assumes the ids sorted; the spec's segments are equal ids, in any order (a lowering of segment ids to
    cu_seqlens or per-block key ranges)."""

    name = "broken-segments-found-by-search"

    def slip(self, q, k, v, call):
        if call.q_segment_ids is None:
            return call
        qs, ks = np.broadcast_arrays(np.asarray(call.q_segment_ids)[..., :, None],
                                     np.asarray(call.kv_segment_ids)[..., None, :])  # (..., Lq, Lk)
        qs, ks = qs[..., :, 0], ks[..., 0, :]  # (..., Lq), (..., Lk)
        keep = np.zeros(qs.shape + ks.shape[-1:], dtype=bool)  # (..., Lq, Lk)
        j = np.arange(ks.shape[-1])
        for idx in np.ndindex(*qs.shape[:-1]):
            lo = np.searchsorted(ks[idx], qs[idx], side="left")  # (Lq,)
            hi = np.searchsorted(ks[idx], qs[idx], side="right")
            keep[idx] = (j >= lo[:, None]) & (j < hi[:, None])
        return _with_keep(replace(call, q_segment_ids=None, kv_segment_ids=None), keep)


class KeyLengthsAsCacheLengths(_Slip):
    """A padded call with key lengths and no query lengths goes to flash_attn_with_kvcache(cache_seqlens=
    kv_lengths), which aligns each sequence at its own cache length (o_b = kv_len_b - Lq, per-sequence
    positions) where the problem's positions are the padded batch's (o = Lk - Lq)."""

    name = "broken-key-lengths-as-cache-lengths"

    def slip(self, q, k, v, call):
        if call.positions != "per_sequence" and call.kv_lengths is not None and call.q_lengths is None:
            return replace(call, positions="per_sequence")
        return call


class WindowOffsetClampedAtZero(_Slip):
    """The window's diagonal offset clamped at 0 (max(0, Lk - Lq): an unsigned seqlen_k - seqlen_q in the
    window's bounds) where bottom-right has more queries than keys; the causal triangle itself is right."""

    name = "broken-window-offset-clamped-at-zero"

    def slip(self, q, k, v, call):
        if call.window is None or call.causal_alignment != "bottom_right" or call.positions == "per_sequence":
            return call
        Lq, Lk = q.shape[-2], k.shape[-2]
        d = np.arange(Lk)[None, :] - np.arange(Lq)[:, None] - max(_offset(call, Lq, Lk), 0)  # (Lq, Lk)
        return _with_keep(replace(call, window=None), _window_keep(d, call.window))


class WindowFromSegmentStart(_Slip):
    """With segment ids the window is measured in positions that restart at each segment (per-document
    position ids, as a varlen lowering of packed documents gives), not on the padded diagonal."""

    name = "broken-window-from-segment-start"

    def slip(self, q, k, v, call):
        if call.window is None or call.q_segment_ids is None or call.positions == "per_sequence":
            return call
        Lq, Lk = q.shape[-2], k.shape[-2]

        def local(ids):  # (..., L): each position less its segment's first
            ids = np.asarray(ids)
            out = np.zeros(ids.shape, dtype=np.int64)
            for idx in np.ndindex(*ids.shape[:-1]):
                first = {}
                out[idx] = [t - first.setdefault(int(s), t) for t, s in enumerate(ids[idx])]
            return out

        d = local(call.kv_segment_ids)[..., None, :] - local(call.q_segment_ids)[..., :, None] \
            - _offset(call, Lq, Lk)  # (..., Lq, Lk)
        return _with_keep(replace(call, window=None), _window_keep(d, call.window))
