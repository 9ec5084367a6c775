"""The machine around the attention numbers: matmul peak, thread counts, timing fidelity."""
from __future__ import annotations

import os
import statistics
import sys
import time

from . import _common, bench_attention  # a module, not its classes: asv would collect those twice

MATMUL_N = 1024  # 2.1 GFLOP per product: ~50 ms here, long enough to swamp call overhead
FIDELITY = dict(backend="torch-sdpa-cpu", batch=_common.BATCH, heads=_common.HEADS, T=2048, E=64,
                op="forward", dtype="float32")


def _import(library: str):
    try:
        return __import__(library)
    except ImportError as e:
        _common.log(f"skip {library}: {e}")
        raise NotImplementedError(f"{library} is not installed: {e}") from None


class PeakMatmul:
    """Best float32 n x n matmul rate, GFLOP/s: the roofline's compute ceiling.

    OPENBLAS_CORETYPE is a one-value parameter so the results say which OpenBLAS kernel NumPy
    used (forcing an older core type slows NumPy's BLAS; torch uses its own)."""

    params = [["numpy", "torch"], [os.environ.get("OPENBLAS_CORETYPE", "unset")], [_common.THREADS]]
    param_names = ["library", "openblas_coretype", "threads"]
    timeout = 120

    def setup(self, library, openblas_coretype, threads):
        lib = _import(library)
        if library == "torch":
            lib.set_num_threads(threads)
            a, b = lib.randn(MATMUL_N, MATMUL_N), lib.randn(MATMUL_N, MATMUL_N)  # (n, n)
            self.product = lambda: lib.mm(a, b)  # (n, n)
        else:
            rng = lib.random.default_rng(0)
            a = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=lib.float32)  # (n, n)
            b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=lib.float32)  # (n, n)
            self.product = lambda: a @ b  # (n, n)
        self.product()  # warm: thread pool start, first touch

    def track_peak_gflops(self, library, openblas_coretype, threads):
        best = float("inf")
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:  # best of ~1 s of products: a peak, not a typical
            start = time.perf_counter()
            self.product()
            best = min(best, time.perf_counter() - start)
        return 2 * MATMUL_N ** 3 / best / 1e9

    track_peak_gflops.unit = "GFLOP/s"


class Threads:
    """The thread counts every benchmark process ran with (fixed in benchmarks/_common.py)."""

    params = [["blas", "torch"]]
    param_names = ["library"]

    def track_threads(self, library):
        if library == "blas":  # what OpenBLAS reports, not what the environment asked for
            count = _common.blas_threads()
            if count is None:
                raise NotImplementedError("no OpenBLAS loaded (or not Linux): BLAS threads unknown")
            return count
        torch = _import("torch")
        _common._fix_framework_threads()
        return torch.get_num_threads()

    track_threads.unit = "threads"


class _FidelityTime(bench_attention.TimeAttention):
    """The harness's own timing benchmark, pinned to the fidelity combination (not collected)."""

    params = [[v] for v in FIDELITY.values()] + [list(_common.CLOCKS)]


def _harness_seconds(clock: str) -> float:
    """Median seconds per call as asv-runner's TimeBenchmark measures it, in this process."""
    from asv_runner.benchmarks.time import TimeBenchmark

    instance = _FidelityTime()
    func = instance.time_attention
    bench = TimeBenchmark("bench_machine._FidelityTime.time_attention", func, [func, instance, sys.modules[__name__]])
    bench.set_param_idx(_common.CLOCKS.index(clock))
    if bench.do_setup():
        raise NotImplementedError(f"{FIDELITY['backend']} skipped (see log)")
    try:
        return statistics.median(bench.do_run()["samples"])
    finally:
        bench.do_teardown()


class Fidelity:
    """torch-sdpa-cpu at T=2048: the harness's time against torch.utils.benchmark.Timer.

    Both time the same prepared callable in the same process with the same clock (CPU time or
    wall), interleaved three times so a load change on the machine hits both; the ratio is
    harness / Timer (1.0 = agreement)."""

    params = [[FIDELITY["backend"]], [FIDELITY["T"]], [FIDELITY["E"]], list(_common.CLOCKS)]
    param_names = ["backend", "T", "E", "clock"]
    timeout = 300

    def setup(self, backend, T, E, clock):
        self.prepared = _common.prepared(*FIDELITY.values())
        import torch.utils.benchmark as torch_benchmark  # the backend loaded torch already

        self.torch_timer = torch_benchmark.Timer(
            stmt="run()", globals={"run": self.prepared.run}, num_threads=_common.THREADS,  # default: 1
            timer=_common.timer_for(self.prepared.backend, clock))

    def _timer_seconds(self) -> float:
        return self.torch_timer.blocked_autorange(min_run_time=1.0).median

    def track_fidelity_ratio(self, backend, T, E, clock):
        harness, timer = [], []
        for _ in range(3):
            harness.append(_harness_seconds(clock))
            timer.append(self._timer_seconds())
        _common.log(f"fidelity: harness {harness} s, Timer {timer} s")
        return statistics.median(harness) / statistics.median(timer)

    track_fidelity_ratio.unit = "ratio"

    def track_timer_seconds(self, backend, T, E, clock):
        """Timer's seconds per call: the loader also divides the sweep's time_ result by it."""
        return self._timer_seconds()

    track_timer_seconds.unit = "seconds"
