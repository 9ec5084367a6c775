"""Time and extra memory of one attention call, per backend x T x E x op x dtype.

Backends come from ATTNSPEC_BACKENDS (comma-separated, the plug-in contract) or every built-in.
A combination a backend declines (no gradients, dtype, framework missing) raises
NotImplementedError in setup: asv records it as skipped and the reason goes to the log.
GFLOP/s is not measured separately: the loader (reports/asv_results.py) divides the cost model
(specs.cost) by the recorded time, so rate and time come from the same samples.
"""
from __future__ import annotations

from . import _common, _memory

SAMPLE_SECONDS = 0.01  # one asv sample holds this much calling time at least


class TimeAttention:
    """Seconds per call; inputs converted and the call warmed up (compiled) in setup."""

    params = _common.params() + [[_common.CLOCK]]
    param_names = _common.PARAM_NAMES + ["clock"]
    rounds = 1  # one process per combination already; a second round doubles the spawns
    # At least 3 samples, at most 10, stop adding once 0.2 s is spent: tiny T gets 10 samples
    # of ~10 ms each, T=2048 gets 3 single calls. The sweep's cost is the ~330 processes asv
    # spawns (one per combination; 1-3 s each with torch or jax) and the calls at T >= 1024.
    repeat = (3, 10, 0.2)
    min_run_count = 1
    warmup_time = 0  # setup already made the first (compiling) and a warm call
    timeout = 600

    def setup(self, backend, batch, heads, T, E, op, dtype, clock):
        self.prepared = _common.prepared(backend, batch, heads, T, E, op, dtype)
        self.timer = _common.timer_for(self.prepared.backend, clock)  # asv reads it after setup
        # asv-runner >= 0.3 re-runs setup before each timed call and times calls one by one
        # when number > 1, so a sample of a 10 us call still holds ~SAMPLE_SECONDS of calls.
        self.number = max(1, int(SAMPLE_SECONDS / max(self.prepared.call_seconds, 1e-7)))

    def time_attention(self, backend, batch, heads, T, E, op, dtype, clock):
        self.prepared.run()


class MemoryAttention:
    """Extra bytes one call needs (see benchmarks/_memory.py for the method per framework)."""

    params = _common.params(_common.MEMORY_E_VALUES)
    param_names = _common.PARAM_NAMES
    timeout = 600

    def setup(self, backend, batch, heads, T, E, op, dtype):
        self.prepared = _common.prepared(backend, batch, heads, T, E, op, dtype, time_warm_call=False)
        method = _memory.method_for(self.prepared.backend, dtype)
        _common.log(f"memory of {backend} {op} T={T} E={E}: {method}")

    def track_extra_bytes(self, backend, batch, heads, T, E, op, dtype):
        p = self.prepared
        return _memory.extra_bytes(p.backend, p.run, p.inputs, op, dtype)

    track_extra_bytes.unit = "bytes"
