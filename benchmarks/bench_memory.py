"""The T sweep's extra memory: bytes one call needs beyond its inputs (benchmarks/_memory.py).

Its own module so asv (which goes by name) runs it after the time benchmarks: a backend that
is slow spends the grid's budget (_grid.BACKEND_BUDGET_SECONDS) on timed combinations first.
"""
from __future__ import annotations

from attnspec.benchmarks import _common, _grid, _memory
from attnspec.benchmarks.bench_attention import sweep


class MemoryAttention:
    """Extra bytes one call needs (see benchmarks/_memory.py for the method per framework)."""

    params = [_common.backend_names(), [_grid.BATCH], [_grid.HEADS], _grid.MEMORY_T, _grid.MEMORY_E,
              _grid.MEMORY_OPS, ["float32"]]
    param_names = ["backend", "batch", "heads", "T", "E", "op", "dtype"]
    timeout = 600

    def setup(self, backend, batch, heads, T, E, op, dtype):
        self.prepared = _common.prepared(backend, sweep(T, E), op, dtype, time_warm_call=False)
        self.method = _memory.method_for(self.prepared.backend, dtype)
        _common.log(f"memory of {backend} {op} T={T} E={E}: {self.method}")

    def track_extra_bytes(self, backend, batch, heads, T, E, op, dtype):
        p = self.prepared
        return _memory.extra_bytes(p.backend, p.run, p.inputs, op, dtype)

    track_extra_bytes.unit = "bytes"
