"""Serving formats (issue 30): a decode batch over a paged KV cache, and a varlen prefill of mixed lengths.

TimePagedDecode: one new token a sequence (Lq = 1: it sees its whole cache) for SERVING_BATCH sequences
whose caches of Lk keys sit in pages of `page_size` keys, placed at random in a pool 2.5x the need
(`specs.formats.to_paged`), NHD layout.  Bound by memory like TimeDecode: the loader turns its time
into KV-read bandwidth (specs.cost.kv_bytes / time) under the measured copy/triad roofs.
TimeVarlenPrefill: one packed call (cu_seqlens) of SERVING_BATCH causal sequences of lengths T, T/2,
T/4, T/8 (specs.cost.prefill_lengths); the loader's GFLOP/s counts the useful pairs only - each
sequence's causal triangle, nothing between sequences.  Only backends that declare the format run;
the others are skipped in setup with the formats they declare.
"""
from __future__ import annotations

from attnspec.benchmarks import _common, _grid, bench_attention


class TimePagedDecode(bench_attention.Timed):
    """Seconds per decode step of a batch over a paged cache (forward only)."""

    params = [_common.backend_names(), [_grid.SERVING_BATCH], [_grid.HEADS], [_grid.HEADS], [1], _grid.PAGED_LK,
              [_grid.E_DEFAULT], ["float32"], _grid.PAGE_SIZES, [_common.CLOCK]]
    param_names = ["backend", "batch", "heads", "kv_heads", "Lq", "Lk", "E", "dtype", "page_size", "clock"]

    def setup(self, backend, batch, heads, kv_heads, Lq, Lk, E, dtype, page_size, clock):
        workload = _common.Workload(batch, heads, kv_heads, Lq, Lk, E, "decode", "paged-NHD", page_size)
        self._prepare(backend, workload, "forward", dtype, clock)

    def time_paged_decode(self, backend, batch, heads, kv_heads, Lq, Lk, E, dtype, page_size, clock):
        self.prepared.run()


class TimeVarlenPrefill(bench_attention.Timed):
    """Seconds per packed causal prefill of mixed lengths (the longest T; forward only)."""

    params = [_common.backend_names(), [_grid.SERVING_BATCH], [_grid.HEADS], _grid.VARLEN_T, [_grid.E_DEFAULT],
              ["float32"], [_common.CLOCK]]
    param_names = ["backend", "batch", "heads", "T", "E", "dtype", "clock"]

    def setup(self, backend, batch, heads, T, E, dtype, clock):
        workload = _common.Workload(batch, heads, heads, T, T, E, "causal", "packed")
        self._prepare(backend, workload, "forward", dtype, clock)

    def time_varlen_prefill(self, backend, batch, heads, T, E, dtype, clock):
        self.prepared.run()
