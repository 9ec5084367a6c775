"""Slips a ninth review wrote in what travels beside the output: the LSE of a call handed q in another
layout, the LSE of a split count's combine, and a list merge's LSEs read as a dense array.  Each is
numpy-naive (correct in every format it declares) with one slip, the output itself right: the suite
reaches each by construction (properties/test_layouts.py and test_knobs.py ask for the LSE too;
test_merge.py's `merge_layouts_agree` hands the states as strided views).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive


def _caps():
    return replace(NumpyNaive.capabilities, dtypes=("float32", "float64"), gradients=False)


class LsePermutedLayout(NumpyNaive):
    """Handed q stored (B, L, H, E) (the permuted layout), the kernel writes its LSE in q's own (L, H) order
    and the caller reads it as (H, L): the output right, the LSE of other rows."""

    name = "broken-lse-permuted-layout"
    capabilities = _caps()

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        if not call.return_lse or q.ndim < 3 or q.strides[-3] >= q.strides[-2]:
            return y
        out, lse = y  # (B, H, L, Ev), (B, H, L)
        return out, np.ascontiguousarray(np.swapaxes(lse, -1, -2)).reshape(lse.shape)  # the slip: (L, H) read as (H, L)


class KnobSplitLseOfLargest(NumpyNaive):
    """A num_splits knob (FA3's): the combine merges the splits' outputs right and returns the largest split's
    LSE, its `+ log(sum of the splits' weights)` forgotten.  One split (the default) right."""

    name = "broken-knob-split-lse-of-largest"
    capabilities = _caps()
    knobs = {"num_splits": (1, 2, 3)}

    def native_attention(self, q, k, v, call):
        n = (call.knobs or {}).get("num_splits", 1)
        y = super().native_attention(q, k, v, call)
        if n == 1 or not call.return_lse:
            return y
        out, _ = y
        Lk = k.shape[-2]
        cuts = np.linspace(0, Lk, n + 1).astype(int)
        lses = []
        for j0, j1 in zip(cuts[:-1], cuts[1:], strict=True):  # each split's own LSE over its keys
            hide = np.where((np.arange(Lk) >= j0) & (np.arange(Lk) < j1), 0.0, -np.inf)  # (Lk,)
            bias = hide if call.bias is None else np.asarray(call.bias, dtype=np.float64) + hide
            lses.append(super().native_attention(q, k, v, replace(call, bias=bias))[1])
        return out, np.max(lses, axis=0)  # the slip: max_j lse_j, not log sum_j exp(lse_j)


class MergeLseReadDense(NumpyNaive):
    """A list merge (FA3's flash_attn_combine) that indexes its LSEs with the strides of a dense array whatever
    it is handed: a transposed or permuted view (a cascade's (Lq, H) LSE seen as (H, Lq)) is read from other
    rows, vllm-project/vllm#22003."""

    name = "broken-merge-lse-read-dense"
    capabilities = _caps()

    def native_merge_states(self, o_parts, lse_parts):
        dense = np.cumprod((1,) + lse_parts.shape[:0:-1])[::-1] * lse_parts.itemsize  # C-order strides
        base = lse_parts
        while isinstance(base.base, np.ndarray) and base.base.size == lse_parts.size:
            base = base.base  # the buffer the view reads
        lse_parts = np.lib.stride_tricks.as_strided(base, lse_parts.shape, tuple(int(s) for s in dense)).copy()
        return super().native_merge_states(o_parts, lse_parts)  # the slip: the buffer read as dense
