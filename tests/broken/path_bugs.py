"""Slips on a kernel's own paths that random draws seldom or never reach: the split-KV (flash-decoding)
path for few queries against a long cache, a window's first key block, the backward's pre-pass past 128
rows, a paged decode's split count, left padding past a key block, merges of tied states and of more
splits than a combine was built for, a split path without the softcap or the window.  Each is a correct
kernel with one slip; the suite reaches each by construction (properties/test_edges.py's split-KV rows
and windows, test_gradients.py's backward grid,
serving_calls.edge_cases and test_paged.py's left padding, test_merge.py's tied and many states).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import flash_twins
from ._kernels import numpy_caps
from ._variants import VariantKernel
from .serving_bugs import _Twin

SPLIT_QUERIES, SPLIT_KEYS = 16, 512  # the split-KV path: at most 16 queries against 512 keys or more


def _split_kv(q, k) -> bool:
    return q.shape[-2] <= SPLIT_QUERIES and k.shape[-2] >= SPLIT_KEYS


class SplitKvGqaModulo(VariantKernel):
    """The split-KV decode path maps query head h to KV head h % Hkv (an interleaved layout's map), not
    h // (Hq / Hkv); the prefill path is right.  Shows only for few queries against 512 keys or more."""

    name = "broken-split-kv-gqa-modulo"
    capabilities = numpy_caps("float32", features=("gqa",))

    def native_attention(self, q, k, v, call):
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if _split_kv(q, k) and call.enable_gqa and Hkv != Hq:
            heads = np.arange(Hq) % Hkv  # the slip: h % Hkv
            k, v = np.take(k, heads, axis=-3), np.take(v, heads, axis=-3)  # (..., Hq, Lk, ·)
            call = replace(call, enable_gqa=False)
        return super().native_attention(q, k, v, call)


class SplitKvCausalBottomRight(VariantKernel):
    """The split-KV decode path hard-wires the decode alignment: causal bottom-right (the queries are the
    cache's newest positions) even when top-left is asked; the prefill path honours the asked one."""

    name = "broken-split-kv-causal-bottom-right"
    capabilities = numpy_caps("float64", features=("causal_bottom_right",))

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k) and call.is_causal:
            call = replace(call, causal_alignment="bottom_right")  # the slip: whatever was asked
        return super().native_attention(q, k, v, call)


class SplitKvDropsSoftcap(VariantKernel):
    """The split-KV decode path takes no softcap argument and drops it (a Gemma-2 decode served uncapped);
    the prefill path caps."""

    name = "broken-split-kv-drops-softcap"
    capabilities = numpy_caps("float16", features=("softcap",))

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k):
            call = replace(call, softcap=None)  # the slip
        return super().native_attention(q, k, v, call)


class SplitKvDropsWindow(VariantKernel):
    """The split-KV decode path applies causal but not the sliding window (a Mistral decode over the whole
    cache); the prefill path windows."""

    name = "broken-split-kv-drops-window"
    capabilities = numpy_caps("float64", features=("window", "causal_bottom_right"))

    def native_attention(self, q, k, v, call):
        if _split_kv(q, k):
            call = replace(call, window=None)  # the slip
        return super().native_attention(q, k, v, call)


class WindowFirstBlockByLastRow(VariantKernel):
    """A sliding-window kernel (64-query tiles, 128-key blocks) that finds a tile's first key block from
    the tile's last row (last + offset - left) instead of its first: the tile's first rows lose the keys
    of the block before.  Right whenever that bound falls in the same block for both rows."""

    name = "broken-window-first-block-by-last-row"
    capabilities = numpy_caps("bfloat16", features=("window",))
    tile, block = 64, 128

    def _visible(self, call, shape, Lq, Lk):
        vis = super()._visible(call, shape, Lq, Lk)
        if call.window is None or call.window[0] is None:
            return vis
        off = self._offset(call, Lq, Lk, "window")
        i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]  # (Lq, 1), (1, Lk)
        last = np.minimum((i // self.tile + 1) * self.tile, Lq) - 1  # (Lq, 1) the tile's last row
        first_key = np.maximum(0, (last + off - call.window[0]) // self.block) * self.block  # the slip
        return vis & (j >= first_key)


class BackwardDeltaGridGap(VariantKernel):
    """The backward's pre-pass D = rowsum(dO * O) launched as cdiv(Lq, 256) programs of a 128-row kernel:
    rows 128..255 of every 256 keep the zero-initialised D, so dQ and dK are wrong there (dV right)."""

    name = "broken-backward-delta-grid-gap"
    capabilities = numpy_caps("float16", gradients=True)

    def _delta(self, dp, p):
        d = super()._delta(dp, p)  # (..., Hq, Lq, 1)
        return np.where((np.arange(d.shape[-2]) % 256 >= 128)[:, None], 0.0, d)  # the slip: rows no program covers


class MergeTieTakesOne(VariantKernel):
    """merge_state as "the larger state plus the other rescaled", the larger picked by lse_a > lse_b and
    the smaller by lse_a < lse_b: two states with equal finite LSEs (equal halves of a row of equal scores)
    both count as the larger, and the merge returns o_b, not the mean."""

    name = "broken-merge-tie-takes-one"
    capabilities = numpy_caps("float32", features=("lse",))

    def native_merge(self, o_a, lse_a, o_b, lse_b):
        a_larger, a_smaller = lse_a > lse_b, lse_a < lse_b  # (..., Lq) the slip: a tie is neither
        hi, lo = np.where(a_larger, lse_a, lse_b), np.where(a_smaller, lse_a, lse_b)  # (..., Lq)
        o_hi = np.where(a_larger[..., None], o_a, o_b)  # (..., Lq, Ev)
        o_lo = np.where(a_smaller[..., None], o_a, o_b)
        finite = np.isfinite(hi)
        with np.errstate(invalid="ignore"):
            w = np.where(finite, np.exp(lo - np.where(finite, hi, 0.0)), 0.0)  # (..., Lq)
        out = (o_hi + o_lo * w[..., None]) / (1 + w)[..., None]
        return out, np.where(finite, hi + np.log1p(w), -np.inf)


class MergeStatesMaxSplits8(VariantKernel):
    """A combine kernel (FA3's flash_attn_combine) built for at most 8 splits a row and dispatched with
    more: the splits past the 8th are never read."""

    name = "broken-merge-states-max-splits-8"
    capabilities = numpy_caps("float64", features=("lse",))

    def native_merge_states(self, o_parts, lse_parts):
        o_parts, lse_parts = o_parts[:8], lse_parts[:8]  # the slip: a fixed 8-split buffer
        top = lse_parts.max(axis=0)  # (..., Lq)
        shift = np.where(np.isfinite(top), top, 0.0)
        w = np.exp(lse_parts - shift)  # (C, ..., Lq)
        total = w.sum(axis=0)
        out = (o_parts * w[..., None]).sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]
        with np.errstate(divide="ignore"):
            return out, np.where(total > 0, shift + np.log(np.where(total > 0, total, 1.0)), -np.inf)


class PagedSplitFloor(_Twin):
    """A split-KV paged decode (partitions of 512 keys, vLLM's paged_attention_v2) that counts its
    partitions as n // 512: the last, partial partition of a cache longer than 512 keys is dropped."""

    name = "broken-paged-split-floor"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "split_floor"
    dtypes = ("float32",)


class PagedLeftpadPastFirstBlock(_Twin):
    """cache_leftpad handled by skipping leftpad // 128 whole key blocks and masking j < leftpad in the
    first block read, the offset not made block-relative: with 128 keys of padding or more, every key of
    that first block is hidden (right while the padding is under a block)."""

    name = "broken-paged-leftpad-past-first-block"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "leftpad_block_mask"
    dtypes = ("bfloat16",)


class PagedLongDecodeGqaModulo(_Twin):
    """vLLM paged_attention_v2's shape: a decode whose cache needs more than one 512-key partition runs a
    kernel of its own, whose KV head is h % Hkv (the short-cache kernel's h // group is right)."""

    name = "broken-paged-long-decode-gqa-modulo"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "long_decode_gqa_modulo"
    dtypes = ("float16",)


class PagedLongDecodeDropsAlibi(_Twin):
    """The multi-partition paged decode kernel (a cache past 512 keys) is launched without the ALiBi slopes
    (the short-cache launch passes them)."""

    name = "broken-paged-long-decode-drops-alibi"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "long_decode_drops_alibi"
    dtypes = ("float64",)
