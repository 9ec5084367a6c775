"""Serving-era slips at edges the draws leave unjudged: a sequence with queries but no keys, a cache that
is left padding all through, a decode's own LSE, a decode's window cut at a page, packed inputs that
are a fused projection's head slices, paged caches that are views of larger storage.  Each is
numpy-naive (correct in every format it declares) with one slip; the suite reaches each by construction
(serving_calls.edge_cases, test_paged.py's _full_cache, the LSE asked in the packed and paged edges,
test_packed.py's head slices, test_paged.py's cache views).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends import numpy_formats
from attnspec.backends.numpy_backends import NumpyNaive
from attnspec.specs.formats import split_layout


def _caps(*dtypes: str):
    return replace(NumpyNaive.capabilities, dtypes=dtypes)


class PackedEmptyKeysUnwritten(NumpyNaive):
    """A varlen kernel that exits early for a sequence with no keys and never writes its rows (torch.empty's
    garbage; here 1.0), flash-attention#1619's class: zeros are declared."""

    name = "broken-packed-empty-keys-unwritten"
    capabilities = _caps("float32")

    def native_packed(self, q, k, v, args, call):
        y = numpy_formats.gathered_packed(self, q, k, v, args, call)
        out = (y[0] if call.return_lse else y).copy()  # (total_q, Hq, Ev)
        cu_q = np.asarray(args.cu_seqlens_q, np.int64)
        used = np.diff(np.asarray(args.cu_seqlens_k, np.int64)) if args.seqused_k is None else np.asarray(args.seqused_k)
        for b in np.flatnonzero(used == 0):
            out[cu_q[b]:cu_q[b + 1]] = 1.0  # the slip: never written
        return (out, y[1]) if call.return_lse else out


class PagedAllLeftPaddingNaN(NumpyNaive):
    """The empty-sequence guard tests cache_seqlens == 0, not cache_seqlens - cache_leftpad == 0: a cache that
    is left padding all through normalises 0 by 0, NaN rows where zeros are declared."""

    name = "broken-paged-all-left-padding-nan"
    capabilities = _caps("float32")

    def native_paged(self, q, k_cache, v_cache, args, call):
        y = numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)
        if args.cache_leftpad is None:
            return y
        lens, pads = np.asarray(args.cache_seqlens, np.int64), np.asarray(args.cache_leftpad, np.int64)
        out = (y[0] if call.return_lse else y).copy()  # (B, Hq, Lq, Ev)
        out[(lens > 0) & (lens == pads)] = np.nan  # the slip: 0 / 0
        return (out, y[1]) if call.return_lse else out


class PagedDecodeLseBase2(NumpyNaive):
    """The paged decode path (one query a sequence: a split-KV kernel whose combine works in base 2)
    returns log2-sum-exp2 unconverted; a natural LSE is declared and prefill rows have it."""

    name = "broken-paged-decode-lse-base2"
    capabilities = _caps("float64")

    def native_paged(self, q, k_cache, v_cache, args, call):
        y = numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)
        if call.return_lse and q.shape[2] == 1:
            return y[0], y[1] / np.log(2.0)  # the slip: base 2
        return y


class PagedDecodeWindowFromPageStart(NumpyNaive):
    """The paged decode path skips the pages wholly left of the window and masks nothing in the first page
    it reads (a block-level sliding window): keys of that page before the window's edge are seen."""

    name = "broken-paged-decode-window-from-page-start"
    capabilities = _caps("float64")

    def native_paged(self, q, k_cache, v_cache, args, call):
        if q.shape[2] == 1 and call.window is not None and call.window[0] is not None:
            lens, P = np.asarray(args.cache_seqlens, np.int64), args.page_size  # bottom-right: the query at len - 1
            first = (lens - 1 - call.window[0]) // P * P  # (B,) the slip: the page's start, not len - 1 - left
            hidden = np.arange(int(lens.max(initial=0)))[None, :] < first[:, None]  # (B, Lk)
            call = replace(call, window=(None, call.window[1]), bias=np.where(hidden, -np.inf, 0.0)[:, None, None, :])
        return numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)


class PackedDenseTokenStride(NumpyNaive):
    """A varlen kernel that checks only q's innermost stride and addresses token t, head h at (t * Hq + h) * E
    from q's start: a q that is a fused QKV projection's slice (token stride past Hq * E) is read from other
    tokens' heads (flash-attention-v100#41, TransformerEngine#1195)."""

    name = "broken-packed-dense-token-stride"
    capabilities = _caps("float64")

    def native_packed(self, q, k, v, args, call):
        dense = (q.shape[1] * q.shape[2] * q.itemsize, q.shape[2] * q.itemsize, q.itemsize)
        q = np.lib.stride_tricks.as_strided(q, q.shape, dense).copy()  # the slip: q's strides not read
        return numpy_formats.gathered_packed(self, q, k, v, args, call)


class PagedSlotsPast128Wrap(NumpyNaive):
    """A paged kernel whose in-page slot index is 7 bits wide (its tile of 128 keys taken for the page):
    at pages over 128 keys, slot s is read at s mod 128 (flashinfer#4347: paged kernels wrong for page
    sizes > 128).  Right wherever a page holds 128 keys or fewer, or a cache ends before slot 128."""

    name = "broken-paged-slots-past-128-wrap"
    capabilities = _caps("float32")

    def native_paged(self, q, k_cache, v_cache, args, call):
        stacked, base = split_layout(args.layout)
        axis = (1 if base == "NHD" else 2) + stacked  # the slot axis of (pages, [2,] P, Hkv, D) or (pages, [2,] Hkv, P, D)
        wrapped = np.arange(args.page_size) % 128  # (P,) the slip: the slot index cut to 7 bits
        k_cache = np.take(k_cache, wrapped, axis=axis)
        v_cache = None if stacked else np.take(v_cache, wrapped, axis=axis)
        return numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)


class PagedDenseCacheStrides(NumpyNaive):
    """A paged kernel that checks only its caches' innermost stride and addresses page p, slot s, head h at
    ((p * P + s) * Hkv + h) * E from the cache's start: K and V halves of one pool are read at half the page
    stride (the other half's pages), rows inside wider ones shifted into the padding, a transposed storage
    with its axes crossed (ROCm/aiter#3498: vLLM's interleaved K/V halves).  Right on the contiguous caches every other paged
    property hands it."""

    name = "broken-paged-dense-cache-strides"
    capabilities = _caps("float32")

    def native_paged(self, q, k_cache, v_cache, args, call):
        def dense(x):  # the slip: the cache's own strides not read
            return None if x is None else at_dense_strides(x).copy()
        return numpy_formats.gathered_paged(self, q, dense(k_cache), dense(v_cache), args, call)


class PagedPageStrideInSlots(NumpyNaive):
    """The page stride taken in whole slots, ``stride(0) // stride(1)`` of them (vllm-project/vllm-xpu-kernels#303:
    a hybrid model's block stride as a count of slots, the division unchecked): right on contiguous caches and
    every other view; on pages padded to a common size (vLLM's page_size_padded, kvcached#399) every page
    past the first is read short of where it starts."""

    name = "broken-paged-page-stride-in-slots"
    capabilities = _caps("float32")

    def native_paged(self, q, k_cache, v_cache, args, call):
        def in_slots(x):  # the slip: the page stride rounded down to whole slots
            if x is None:
                return None
            page = x.strides[0] // x.strides[1] * x.strides[1]
            return np.lib.stride_tricks.as_strided(x, x.shape, (page,) + x.strides[1:]).copy()  # within x: page <= its own
        return numpy_formats.gathered_paged(self, q, in_slots(k_cache), in_slots(v_cache), args, call)


def at_dense_strides(x: np.ndarray) -> np.ndarray:
    """x's memory read (and written) at a dense tensor's strides of its shape, last axis 1: a view."""
    strides = x.itemsize * np.cumprod((1,) + x.shape[:0:-1])[::-1]
    return np.lib.stride_tricks.as_strided(x, x.shape, tuple(int(s) for s in strides))
