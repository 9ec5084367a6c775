"""Slips a thirteenth review wrote into format paths whose padded call stays right: a paged decode kernel
rounding P to the other fp8 format, a varlen kernel passing the sinks through the softcap with the scores,
and a varlen call writing its LSE's query heads in KV-major order under grouped heads.  The suite's draws
reached each only at deep; it now reaches them by construction (test_fp8's `p_rounding_in_format_calls`, the
serving edge cases' rows of 8 query heads on 2 KV heads and of sinks beside a softcap of their size).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive, NumpyTiled


class PagedPRoundedE5m2(NumpyTiled):
    """The paged path rounds P to e5m2 for an e4m3 cache (the decode kernel's template given the other format);
    the padded and packed calls round it to e4m3, as declared."""

    name = "broken-paged-p-rounded-e5m2"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float8_e4m3fn",))

    def native_paged(self, q, k_cache, v_cache, args, call):
        if call.dtype == "float8_e4m3fn":
            call = replace(call, dtype="float8_e5m2")  # the slip: only P's rounding reads call.dtype there
        return super().native_paged(q, k_cache, v_cache, args, call)


class PackedSinkSoftcapped(NumpyTiled):
    """The packed path folds the sinks in as a score column, so a softcap caps them too: cap * tanh(s_h / cap)."""

    name = "broken-packed-sink-softcapped"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float64",))

    def native_packed(self, q, k, v, args, call):
        if call.sinks is not None and call.softcap is not None:
            s = np.asarray(call.sinks)
            call = replace(call, sinks=(call.softcap * np.tanh(s / call.softcap)).astype(s.dtype))  # the slip
        return super().native_packed(q, k, v, args, call)


class PackedLseGqaHeadsInterleaved(NumpyNaive):
    """The packed call's LSE rows written KV-major under grouped heads: row h holds head (h % Hkv) * g + h // Hkv
    (its output is right)."""

    name = "broken-packed-lse-gqa-heads-interleaved"
    capabilities = replace(NumpyNaive.capabilities, dtypes=("float32",))

    def native_packed(self, q, k, v, args, call):
        y = super().native_packed(q, k, v, args, call)
        Hq, Hkv = q.shape[1], k.shape[1]
        if not call.return_lse or Hq == Hkv:
            return y
        out, lse = y  # lse (Hq, total_q)
        g = Hq // Hkv
        return out, lse[[(h % Hkv) * g + h // Hkv for h in range(Hq)]]  # the slip
