"""Decode: Lq new queries against a KV cache of Lk keys, Hq = 8 query heads over Hkv KV heads.

Lq = 1 is one generated token (it sees the whole cache: no mask); Lq = 4 is a speculative
step (the 4 new tokens see the cache and each other causally: bottom-right aligned, so a backend
that declares no bottom-right causal mode is skipped, never emulated).  Hkv < Hq is grouped-query
attention (Hkv = 1: multi-query), which needs the backend's "gqa" feature.  A decode step reads
every key and value once and does ~2 FLOPs per byte read, so it is bound by memory, not by
the matmul peak: the loader turns the time into KV-read bandwidth (specs.cost.kv_bytes / time)
and the report draws it under the STREAM-style copy/triad bandwidth bench_machine measures.
"""
from __future__ import annotations

from attnspec.benchmarks import _common, _grid, bench_attention


class TimeDecode(bench_attention.Timed):
    """Seconds per decode step (forward only: inference), every query head its own KV head."""

    params = [_common.backend_names(), [_grid.BATCH], [_grid.HEADS], [_grid.HEADS], _grid.DECODE_LQ,
              _grid.DECODE_LK, [_grid.E_DEFAULT], _grid.DECODE_DTYPES, [_common.CLOCK]]
    param_names = ["backend", "batch", "heads", "kv_heads", "Lq", "Lk", "E", "dtype", "clock"]

    def setup(self, backend, batch, heads, kv_heads, Lq, Lk, E, dtype, clock):
        why = _grid.left_out("decode", Lq=Lq, dtype=dtype)
        if why:
            _common.skip(why)
        if heads % kv_heads:
            _common.skip(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
        workload = _common.Workload(batch, heads, kv_heads, Lq, Lk, E, "decode")
        self._prepare(backend, workload, "forward", dtype, clock)

    def time_decode(self, backend, batch, heads, kv_heads, Lq, Lk, E, dtype, clock):
        self.prepared.run()


class TimeGroupedDecode(TimeDecode):
    """Decode with Hq = 8 query heads over fewer KV heads (Hkv = 1: multi-query); by default one
    token against the largest cache, next to TimeDecode's Hkv = 8 step of the same size."""

    params = [_common.backend_names(), [_grid.BATCH], [_grid.HEADS], _grid.GROUPED_HKV, _grid.GROUPED_LQ,
              _grid.GROUPED_LK, [_grid.E_DEFAULT], _grid.GROUPED_DTYPES, [_common.CLOCK]]
