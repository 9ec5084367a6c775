"""The T sweep: time of one call, Lq = Lk = T, per backend x T x E x op x dtype.

Backends come from ATTNSPEC_BACKENDS (comma-separated, the plug-in contract) or every installed
built-in.  A combination a backend declines (dtype, no gradients, framework missing) or the grid
leaves out raises NotImplementedError in setup: asv records it as skipped (n/a), the reason goes
to the log.  GFLOP/s is not measured separately: the loader (reports/asv_results.py) divides the
cost model (specs.cost) by the recorded time, so rate and time come from the same samples.
"""
from __future__ import annotations

from attnspec.benchmarks import _common, _grid

SAMPLE_SECONDS = 0.005  # one asv sample holds this much calling time at least


def sweep(T: int, E: int) -> _common.Workload:
    return _common.Workload(_grid.BATCH, _grid.HEADS, _grid.HEADS, T, T, E, "none")


class Timed:
    """What every time_ benchmark shares: asv's sampling and the clock."""

    rounds = 1  # one process per combination already; a second round doubles the processes
    # _grid.SAMPLES samples at least (6: enough for asv continuous to call a change significant),
    # up to 10 while the combination has spent under 0.1 s on them; set per call in setup.
    repeat = (_grid.SAMPLES, max(_grid.SAMPLES, 10), 0.1)
    min_run_count = 1
    warmup_time = 0  # setup already made the first (compiling) and a warm call
    timeout = 600

    def _prepare(self, backend, workload, op, dtype, clock):
        self.prepared = _common.prepared(backend, workload, op, dtype)
        self.timer = _common.timer_for(self.prepared.backend, clock)  # asv reads it after setup
        # asv-runner >= 0.3 re-runs setup before each timed call and times calls one by one
        # when number > 1, so a sample of a 10 us call still holds ~SAMPLE_SECONDS of calls.
        self.number = max(1, int(SAMPLE_SECONDS / max(self.prepared.call_seconds, 1e-7)))
        if self.prepared.call_seconds > 0.1:  # large T: exactly SAMPLES single calls (asv reads repeat after setup)
            self.repeat = (_grid.SAMPLES, _grid.SAMPLES, 0.0)
        if not getattr(self, "_charged", False):  # setup runs again before every timed call: charge once
            self._charged = True
            _common.spend(backend, max(self.repeat[0] * self.number * self.prepared.call_seconds, self.repeat[2]))


class TimeAttention(Timed):
    """Seconds per call; inputs converted and the call warmed up (compiled) in setup."""

    params = [_common.backend_names(), [_grid.BATCH], [_grid.HEADS], _grid.T_VALUES, _grid.E_VALUES, _grid.OPS,
              _grid.DTYPES, [_common.CLOCK]]
    param_names = ["backend", "batch", "heads", "T", "E", "op", "dtype", "clock"]

    def setup(self, backend, batch, heads, T, E, op, dtype, clock):
        self._prepare(backend, sweep(T, E), op, dtype, clock)

    def time_attention(self, backend, batch, heads, T, E, op, dtype, clock):
        self.prepared.run()


class TimeHalfPrecision(TimeAttention):
    """The sweep in bfloat16 and float16, wherever a backend runs them (its own axes: the
    default grid times the forward at T = 4, 256, 2048; the report rates it against the
    matmul peak of the same dtype)."""

    params = [_common.backend_names(), [_grid.BATCH], [_grid.HEADS], _grid.HALF_T, _grid.E_VALUES, _grid.HALF_OPS,
              _grid.HALF_DTYPES, [_common.CLOCK]]


class Device:
    """Where each backend runs (1: a GPU, 0: the CPU), recorded with the results so the report files a
    GPU kernel's rows under the GPU's machine from the results alone."""

    params = [_common.backend_names()]
    param_names = ["backend"]

    def track_on_gpu(self, backend):
        return 0.0 if _common.device_of(backend) == "cpu" else 1.0

    track_on_gpu.unit = "gpu"
