"""Causal and sliding-window self-attention (Lq = Lk = T): is the skipped work really skipped?

mask "causal": key j visible to query i when j <= i (half the pairs); "window-256": j in
[i - 255, i], a 256-key sliding window (jax's local_window_size=(255, 0), flash-attention's
window_size=(255, 0)), which needs the backend's "window" feature.  The loader credits only the
visible pairs (specs.cost.useful_flops): a kernel that skips the hidden blocks shows a rate like
the unmasked sweep's, one that computes and discards them shows about half of it (causal) or
far less (window).
"""
from __future__ import annotations

from attnspec.benchmarks import _common, _grid, bench_attention


class TimeMasked(bench_attention.Timed):
    """Seconds per call of a masked problem."""

    params = [_common.backend_names(), [_grid.BATCH], [_grid.HEADS], _grid.MASK_T, [_grid.E_DEFAULT], _grid.MASKS,
              _grid.MASK_OPS, _grid.MASK_DTYPES, [_common.CLOCK]]
    param_names = ["backend", "batch", "heads", "T", "E", "mask", "op", "dtype", "clock"]

    def setup(self, backend, batch, heads, T, E, mask, op, dtype, clock):
        why = _grid.left_out("masked", T=T, mask=mask)
        if why:
            _common.skip(why)
        self._prepare(backend, _common.Workload(batch, heads, heads, T, T, E, mask), op, dtype, clock)

    def time_masked(self, backend, batch, heads, T, E, mask, op, dtype, clock):
        self.prepared.run()
