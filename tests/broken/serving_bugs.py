"""Slips in serving-era kernels (issue 30): per-sequence alignment, packed and paged addressing.

The twins of flash-attention's serving entry points (flash_twins.py) as Backends of their formats,
with one ``slip`` each; bfloat16 through _kernels' storage, so the family runs in every dtype.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from attnspec.backends.flash_functions import FlashFunctionBackend
from attnspec.backends.numpy_backends import NumpyNaive, NumpyTiled

from . import flash_twins
from ._kernels import NumpyBackend, store, widened


class _Twin(FlashFunctionBackend):
    """flash_twins.varlen / kvcache (with `slip`) as a backend of the packed / paged-NHD format."""

    form_fn = staticmethod(flash_twins.varlen)
    slip = ""
    dtypes = ("float64",)
    to_native = NumpyBackend.to_native
    native_dtype = NumpyBackend.native_dtype

    def __init__(self):
        super().__init__(functools.update_wrapper(functools.partial(self.form_fn, slip=self.slip), self.form_fn),
                         self.name)
        self.capabilities = replace(self.capabilities, dtypes=self.dtypes)

    def _stored(self, y, call):
        return (store(y[0], call.dtype), y[1]) if call.return_lse else store(y, call.dtype)

    def native_packed(self, q, k, v, args, call):
        return self._stored(super().native_packed(*widened(q, k, v), args, call), call)

    def native_paged(self, q, k_cache, v_cache, args, call):
        return self._stored(super().native_paged(*widened(q, k_cache, v_cache), args, call), call)


class ReadsPastCuSeqlens(_Twin):
    """Each sequence reads one key more than cu_seqlens_k gives it: the next sequence's first key, or
    an unused (seqused_k) or trailing token (rows outside the sequence touched, flash-attention#1661)."""

    name = "broken-reads-past-cu-seqlens"
    slip = "past_cu_seqlens"
    dtypes = ("bfloat16",)


class WritesRowsPastCuSeqlens(_Twin):
    """Declares padded rows zeros, yet its last sequence's tile runs on past cu_seqlens_q[-1] and writes
    the rows there (flash-attention#1661: rows outside cu_seqlens_q modified)."""

    name = "broken-writes-rows-past-cu-seqlens"
    slip = "rows_past_cu_seqlens"
    dtypes = ("float32",)

    def __init__(self):
        super().__init__()
        self.semantics = replace(self.semantics, padded_rows="zeros")


class PaddedSeqlenK(_Twin):
    """Every sequence reads max_seqlen_k keys, the padded length, instead of its own
    (vllm-project/flash-attention#18: a split-KV kernel used params.seqlen_k)."""

    name = "broken-padded-seqlen-k"
    slip = "padded_seqlen_k"
    dtypes = ("float32",)


class PagePlacement(_Twin):
    """Reads a sequence's pages in sorted order instead of the block table's: right only when the pages
    happen to be placed in order (pytorch/pytorch#182593: output depending on physical placement)."""

    name = "broken-page-placement"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "page_order"
    dtypes = ("float64",)


class PrescalesCacheInPlace(_Twin):
    """Multiplies the keys by the scale where they lie in the cache, a sequence at a time, then attends
    with scale 1: right for pages of one sequence each, wrong for a page two block tables share (scaled
    twice), and a cache written by a call that appends nothing."""

    name = "broken-prescales-cache-in-place"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "prescale_in_place"
    dtypes = ("float64",)


class IgnoresCacheLeftpad(_Twin):
    """cache_leftpad accepted and never used: keys from 0, the left padding read
    (Dao-AILab/flash-attention#1788)."""

    name = "broken-ignores-cache-leftpad"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "ignores_leftpad"
    dtypes = ("float16", "float32")


class DecodeSkipsNewestKey(_Twin):
    """A decode step (one query a sequence) reads the keys before cache_seqlens - 1: the token just
    appended is left out (an off-by-one of a decode kernel's context length); prefill rows are right."""

    name = "broken-decode-skips-newest-key"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "decode_skips_newest"
    dtypes = ("float16",)


class LeftpadCountedTwice(_Twin):
    """cache_leftpad subtracted from the keys and again from the queries' positions: each row's causal
    diagonal sits `leftpad` keys early, so a left-padded sequence loses its last keys."""

    name = "broken-leftpad-counted-twice"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "leftpad_counted_twice"
    dtypes = ("bfloat16",)


class ChunkWithinItself(_Twin):
    """A prefill chunk of Lq queries attends to the last Lq keys of its cache only - its own - and never
    to the past before it (kekzl/imp#117: a chunked prefill that attended only within the chunk)."""

    name = "broken-chunk-within-itself"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "chunk_within_itself"
    dtypes = ("float32",)


class StackedVPageStride(_Twin):
    """Over FlashInfer's one K/V tensor (num_pages, 2, P, Hkv, E), addresses page p's values at a separate V
    cache's page stride - half-page p + 1 instead of 2p + 1 - as a kernel ported from k_cache/v_cache
    pointers that kept V's old stride would: right for page 0 only."""

    name = "broken-stacked-v-page-stride"
    form_fn = staticmethod(flash_twins.kvcache_stacked)
    slip = "v_page_stride"
    dtypes = ("float32",)


class StackedHalvesSwapped(NumpyTiled):
    """Reads a stacked K/V tensor's halves the other way round (index 0 as V, 1 as K); its NHD, HND and
    padded calls are right, so only the layouts' agreement (or a stacked call against the reference) sees
    it.  Run by tests/test_backends_formats.py: Backend.forward never makes its paged calls (no witness)."""

    name = "broken-stacked-halves-swapped"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float64",))

    def native_paged(self, q, k_cache, v_cache, args, call):
        if args.layout.startswith("stacked-"):
            k_cache = k_cache[:, ::-1]  # (num_pages, 2, ...): the values where the keys belong
        return super().native_paged(q, k_cache, v_cache, args, call)


class ClampsBadIndices(_Twin):
    """Declares that it refuses bad index arguments (Semantics.rejects_bad_indices) yet clamps them: a
    block table column past its end, a page id outside the pool - out-of-bounds input read silently as
    some page's keys.  Right on every valid call; the bad-index questions judge the declaration."""

    name = "broken-clamps-bad-indices"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "clamp_indices"
    dtypes = ("float64",)

    def __init__(self):
        super().__init__()
        self.semantics = replace(self.semantics, rejects_bad_indices=True)


class AppendToNextSequence(_Twin):
    """Writes sequence b's new keys through the next sequence's block table (the wrong batch entry of the
    cache updated, Dao-AILab/flash-attention#772).  Like AppendOneLate, run by
    tests/test_backends_formats.py (an append is never made by Backend.forward)."""

    name = "broken-append-to-next-sequence"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "append_next_sequence"
    dtypes = ("float64",)


class DecodeDispatchByFirst(_Twin):
    """A varlen batch whose first sequence has one query is run by the decode kernel, which needs no causal
    mask: in a mixed batch of decodes and prefill chunks, the chunks' queries see their future."""

    name = "broken-decode-dispatch-by-first"
    slip = "decode_dispatch_by_first"
    dtypes = ("float64",)


class AlignsByPaddedLengths(NumpyNaive):
    """Declares per-sequence positions and aligns every sequence at the padded Lk - Lq (attnspec's own
    definition before issue 30): chunked prefill and mixed batches wrong."""

    name = "broken-aligns-by-padded-lengths"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float16", "float64"), gradients=False)

    def native_attention(self, q, k, v, call):
        return super().native_attention(q, k, v, replace(call, positions="global"))


class AppendOneLate(_Twin):
    """Appends each new key one slot past cache_seqlens[b] (an off-by-one in the write offset; the class of
    Dao-AILab/flash-attention#772, the wrong entry of the cache updated).  Not in the proof of teeth's
    catalogue: its witness would need an append, which Backend.forward never makes;
    tests/test_backends_formats.py runs the append property on it instead."""

    name = "broken-append-one-late"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "append_one_late"
    dtypes = ("float64",)


class PackedGradientPastCuSeqlens(NumpyNaive):
    """A packed backward that leaves stale values (here: ones) in dK/dV of the tokens no sequence owns -
    past cu_seqlens_k[-1] and past seqused_k - instead of zeros (pytorch/pytorch#176793: NaN gradients
    when the tensors are longer than cu_seqlens[-1]).  Run by tests/test_backends_formats.py."""

    name = "broken-packed-gradient-past-cu-seqlens"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float64",))

    def native_packed_backward(self, q, k, v, grad_out, args, call):
        import numpy as np
        dq, dk, dv = super().native_packed_backward(q, k, v, grad_out, args, call)
        stale = np.ones(k.shape[0], dtype=bool)  # (total_k,)
        cu, used = np.asarray(args.cu_seqlens_k), (np.diff(args.cu_seqlens_k) if args.seqused_k is None
                                                   else np.asarray(args.seqused_k))
        for b in range(len(cu) - 1):
            stale[cu[b]:cu[b] + used[b]] = False
        dk[stale], dv[stale] = 1.0, 1.0
        return dq, dk, dv


class PackedBackwardNaNOneKey(NumpyNaive):
    """A packed backward that gives NaN dQ for a sequence of one key (Dao-AILab/flash-attention#443:
    varlen backward NaN with seqlen_k = 1); every other sequence right.  Run by tests/test_backends_formats.py
    (its forward is right: no witness for Backend.forward)."""

    name = "broken-packed-backward-nan-one-key"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float32",))

    def native_packed_backward(self, q, k, v, grad_out, args, call):
        import numpy as np
        dq, dk, dv = super().native_packed_backward(q, k, v, grad_out, args, call)
        cu_q, cu_k = np.asarray(args.cu_seqlens_q), np.asarray(args.cu_seqlens_k)
        used = np.diff(cu_k) if args.seqused_k is None else np.asarray(args.seqused_k)
        for b in range(len(cu_q) - 1):
            if used[b] == 1:
                dq[cu_q[b]:cu_q[b + 1]] = np.nan
        return dq, dk, dv


# ---- issue 31's sinks in the serving calls: numpy-tiled (its pages are its key blocks) with one slip ----------

class SinksDroppedOffPadded(NumpyTiled):
    """Applies the sinks in its padded call; its packed and paged calls (another code path, as vLLM's prefill
    path was) accept them and drop them (vllm-project/vllm#52148: gpt-oss scored 0 on GSM8K)."""

    name = "broken-sinks-dropped-off-padded"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float32",))

    def native_packed(self, q, k, v, args, call):
        return super().native_packed(q, k, v, args, replace(call, sinks=None))  # the slip

    def native_paged(self, q, k_cache, v_cache, args, call):
        return super().native_paged(q, k_cache, v_cache, args, replace(call, sinks=None))  # the slip


class SinkPerPage(NumpyTiled):
    """A paged kernel whose pages are its splits, each folding the sink into its own partial sum, merged:
    the sink counted once per page read (ROCm/rocm-libraries#12227's split-KV slip with pages as the
    splits) - what it returns computed exactly: the row over its keys with n_pages exp(s_h) in the
    denominator.  Right whenever a sequence's keys fit one page."""

    name = "broken-sink-per-page"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float64",))

    def native_paged(self, q, k_cache, v_cache, args, call):
        if call.sinks is None:
            return super().native_paged(q, k_cache, v_cache, args, call)
        out, lse = super().native_paged(q, k_cache, v_cache, args, replace(call, sinks=None, return_lse=True))
        lens = np.asarray(args.cache_seqlens, np.int64)  # (B,)
        pads = np.zeros_like(lens) if args.cache_leftpad is None else np.asarray(args.cache_leftpad, np.int64)
        pages = -(-lens // args.page_size) - pads // args.page_size  # (B,) the pages each sequence reads
        sink = np.asarray(call.sinks, np.float64)[None, :, None] + np.log(np.maximum(pages, 1))[:, None, None]  # (B, Hq, 1)
        total = np.logaddexp(lse, sink)  # (B, Hq, Lq): the slip, n_pages sinks in each row's sum
        keep = np.where(np.isfinite(lse), np.exp(lse - total), 0.0)  # (B, Hq, Lq)
        out = out * keep[..., None]  # (B, Hq, Lq, Ev)
        return (out, total) if call.return_lse else out
