"""Slips a sixteenth review wrote where the paged call's own paths meet what the draws never gave it: a
one-sequence fast path that reads the pool's pages in order instead of its block table (a batch-size-gated
path, huggingface/transformers#46773's class; scattered page ids: flashinfer-ai/flashinfer#3219), a paged
decode's Q.K^T loop bounded by a 256-wide template (MLA's latent caches are 512 and 576 wide), and a split
count honoured by the padded call but dropping the last keys in the paged one (Dao-AILab/flash-attention#1217:
paged KV with num_splits > 1).  The draws give per-sequence problems batches of 2 or more and head dims up to
256, and knobs reached the padded forward only; the suite now reaches each by construction (the serving edge
cases' one sequence and head dims 512 and 576, test_knobs' `knob_settings_in_format_calls`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends import numpy_formats as nf
from attnspec.backends.numpy_backends import NumpyNaive

_FORWARD = replace(NumpyNaive.capabilities, dtypes=("float32", "float64"), gradients=False)


class PagedBatchOneIgnoresTable(NumpyNaive):
    """A paged call of one sequence reads pages 0, 1, 2, ... of the pool, not its block table's."""

    name = "broken-paged-batch-one-ignores-table"
    capabilities = _FORWARD

    def native_paged(self, q, k_cache, v_cache, args, call):
        table = np.asarray(args.block_table)  # (B, pages a sequence)
        if table.shape[0] == 1:  # the slip: a single request's cache taken as laid out in order
            args = replace(args, block_table=np.arange(table.size, dtype=table.dtype).reshape(table.shape))
        return nf.gathered_paged(self, q, k_cache, v_cache, args, call)


class PagedHeadDimCapped256(NumpyNaive):
    """The paged call's Q.K^T sums the first 256 components of a wider head (its padded call right)."""

    name = "broken-paged-head-dim-capped-256"
    capabilities = _FORWARD
    _in_paged = False

    def native_paged(self, *args):
        self._in_paged = True
        try:
            return nf.gathered_paged(self, *args)
        finally:
            self._in_paged = False

    def native_attention(self, q, k, v, call):
        if self._in_paged and q.shape[-1] > 256:
            scale = 1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale  # the head's own scale kept
            q, k, call = q[..., :256], k[..., :256], replace(call, scale=float(scale))  # the slip
        return super().native_attention(q, k, v, call)


class PagedKnobSplitsDropTail(NumpyNaive):
    """A num_splits knob the padded call honours; the paged call at num_splits = n > 1 reads each sequence's
    first Lk // n * n keys only (every split Lk // n keys, the remainder dropped)."""

    name = "broken-paged-knob-splits-drop-tail"
    capabilities = _FORWARD
    knobs = {"num_splits": (1, 2, 3)}

    def native_paged(self, q, k_cache, v_cache, args, call):
        n = int((call.knobs or {}).get("num_splits", 1))
        if n > 1:  # the slip
            ends = np.asarray(args.cache_seqlens, np.int64)  # (B,)
            starts = np.zeros_like(ends) if args.cache_leftpad is None else np.asarray(args.cache_leftpad, np.int64)
            args = replace(args, cache_seqlens=(starts + (ends - starts) // n * n).astype(np.int32))
        return nf.gathered_paged(self, q, k_cache, v_cache, args, call)
