"""Slips of the packed and paged calls' LSE and of sinks on the packed backward and the append call -
each right on the padded call - found by a review that wrote new bugs against the suite (2026-12-03); an
append that writes past its rows in a cache handed as a view.  tests/test_suite_format_bugs.py runs the
suite's format properties on each."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends import numpy_formats
from attnspec.backends.numpy_backends import NumpyNaive, NumpyTiled
from attnspec.specs.formats import kv_halves, split_layout


def _caps(base, dtype: str):
    return replace(base.capabilities, dtypes=(dtype,))


class PackedLseBase2(NumpyNaive):
    """The packed call returns log2-sum-exp2 (FlashInfer's convention) while the backend declares a
    natural LSE and its padded call returns one: a merge of the varlen LSE weighs the states wrongly."""

    name = "broken-packed-lse-base2"
    capabilities = _caps(NumpyNaive, "float32")

    def native_packed(self, q, k, v, args, call):
        y = numpy_formats.gathered_packed(self, q, k, v, args, call)
        return (y[0], y[1] / np.log(2.0)) if call.return_lse else y


class PackedLsePaddedLayout(NumpyNaive):
    """The packed LSE computed in the padded layout (Hq, B, max_seqlen_q) and read flat as (Hq, total_q),
    not gathered through cu_seqlens_q: right while every sequence but the last has max_seqlen_q queries."""

    name = "broken-packed-lse-padded-layout"
    capabilities = _caps(NumpyNaive, "float64")

    def native_packed(self, q, k, v, args, call):
        y = numpy_formats.gathered_packed(self, q, k, v, args, call)
        if not call.return_lse:
            return y
        out, lse = y  # (total_q, Hq, Ev), (Hq, total_q)
        cu = np.asarray(args.cu_seqlens_q, np.int64)
        padded = np.full((lse.shape[0], cu.size - 1, int(args.max_seqlen_q)), -np.inf)  # (Hq, B, max_q)
        for b in range(cu.size - 1):
            padded[:, b, :cu[b + 1] - cu[b]] = lse[:, cu[b]:cu[b + 1]]
        flat = padded.reshape(lse.shape[0], -1)  # the slip: (Hq, B * max_q) read as (Hq, total_q)
        wrong = np.full_like(lse, -np.inf)
        n = min(lse.shape[1], flat.shape[1])
        wrong[:, :n] = flat[:, :n]
        return out, wrong


class PagedLseDropsSink(NumpyNaive):
    """Declares an LSE with the sink (its padded call holds it) but the paged call folds the sink into the
    output only and returns the LSE over the keys."""

    name = "broken-paged-lse-drops-sink"
    capabilities = _caps(NumpyNaive, "float32")
    semantics = replace(NumpyNaive.semantics, lse_with_sinks=True)

    def native_paged(self, q, k_cache, v_cache, args, call):
        y = numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)
        if not call.return_lse or call.sinks is None:
            return y
        _, keys_only = numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, replace(call, sinks=None))
        return y[0], keys_only  # the slip


class PagedLseFirstSplit(NumpyTiled):
    """A split-KV paged kernel (a split a page) that merges the splits' outputs right but returns the
    first split's LSE: right whenever a sequence's keys fit in one page."""

    name = "broken-paged-lse-first-split"
    capabilities = _caps(NumpyTiled, "float64")

    def native_paged(self, q, k_cache, v_cache, args, call):
        y = numpy_formats.tiled_paged(self, q, k_cache, v_cache, args, call)
        if not call.return_lse:
            return y
        lens = np.asarray(args.cache_seqlens, np.int64)
        pads = np.zeros_like(lens) if args.cache_leftpad is None else np.asarray(args.cache_leftpad, np.int64)
        first = replace(args, cache_seqlens=np.minimum(lens, (pads // args.page_size + 1) * args.page_size).astype(np.int32))
        _, lse = numpy_formats.tiled_paged(self, q, k_cache, v_cache, first, replace(call, is_causal=False, window=None))
        return y[0], lse  # the slip: the first split's statistics


class PackedBackwardIgnoresSinks(NumpyNaive):
    """The packed backward recomputes the weights without the sinks (rows summing to 1) while its forward
    applied them: sinks added to a forward kernel and not to its backward."""

    name = "broken-packed-backward-ignores-sinks"
    capabilities = _caps(NumpyNaive, "float32")

    def native_packed_backward(self, q, k, v, grad_out, args, call):
        return numpy_formats.gathered_packed_backward(self, q, k, v, grad_out, args, replace(call, sinks=None))


class AppendDropsSinks(NumpyNaive):
    """The fused append-then-attend call takes the sinks and drops them (the packed and paged calls apply
    them): vllm-project/vllm#52148's class, one code path that lost them."""

    name = "broken-append-drops-sinks"
    capabilities = _caps(NumpyNaive, "float32")

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call):
        return numpy_formats.appended_paged(self, q, k_cache, v_cache, k_new, v_new, args, replace(call, sinks=None))


class AppendRowsAtTheirStride(NumpyNaive):
    """The append copies each new K row at the length of its cache's row stride, not of its head dim:
    right while rows are dense; where each row is a slice of a wider one (MLA's latent part beside its rope
    part in one cache row) it writes over the rest of the wider row - memory the cache does not own - and in
    a transposed storage's view over the other slots of its page."""

    name = "broken-append-rows-at-their-stride"
    capabilities = _caps(NumpyNaive, "float32")

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call):
        P, lens = args.page_size, np.asarray(args.cache_seqlens, np.int64)
        table = np.asarray(args.block_table, np.int64)
        kc = kv_halves(k_cache, v_cache, args.layout)[0]  # (pages, P, Hkv, E) or (pages, Hkv, P, E)
        nhd = split_layout(args.layout)[1] == "NHD"
        width = kc.strides[-2] // kc.itemsize  # the slip: the row's length read off the stride between rows
        storage = kc
        while storage.base is not None:
            storage = storage.base
        # the array owning the memory holds it in one block; past its end is no memory of this process's to
        # write (a GPU's allocator has some there)
        end = storage.__array_interface__["data"][0] + storage.nbytes
        for b in range(table.shape[0]):
            for t in range(k_new.shape[1]):
                page, slot = table[b, (lens[b] + t) // P], (lens[b] + t) % P
                for h, row in enumerate(kc[(page, slot) if nhd else (page, slice(None), slot)]):  # (E,) a head's
                    at = row.__array_interface__["data"][0]
                    n = min(width, (end - at) // row.itemsize)
                    wide = np.lib.stride_tricks.as_strided(row, (n,), row.strides)  # (n,) from the row's start
                    wide[:] = np.resize(k_new[b, t, h], n)  # the row, then the row again past its end
        return numpy_formats.appended_paged(self, q, k_cache, v_cache, k_new, v_new, args, call)  # the rows right
