"""The machine around the attention numbers: matmul peaks per dtype, memory bandwidth, thread
counts, timing fidelity.  Same process layout and thread count as the attention benchmarks."""
from __future__ import annotations

import os
import statistics
import sys
import time

from attnspec.benchmarks import _common, _grid, _threads, bench_attention  # modules, not classes: asv would collect those twice

MATMUL_N = 1024  # 2.1 GFLOP per product: long enough on one core to swamp call overhead
GPU_MATMUL_N = 8192  # 1.1 TFLOP: long enough on a GPU's tensor cores; 1024 would time the launch
# A roof is a best-of (a peak, not a typical value): a few products or passes reach it, and the
# machine's benchmarks run alone, before the shards, with the other cores idle - so each spends
# a short budget (products at least 3).  Figures per product: docs/measurements.md.
MATMUL_BUDGET_SECONDS, BANDWIDTH_BUDGET_SECONDS = 0.3, 0.2
# The GPU's roofs, measured when one is present (skipped otherwise).  The report files their rows,
# and those of the GPU backends, under a machine of their own ("<host> gpu": reports/asv_results.py),
# so a GPU kernel's rate is read against its own device's peak and bandwidth, never the CPU's.
GPU_LIBRARY, GPU_KERNEL = "torch-cuda", "cuda-triad"
FIDELITY = dict(backend="torch-sdpa-cpu", T=2048, E=64, op="forward", dtype="float32")
STREAM_MIB = [16, 512]  # per array: inside the last-level cache, and well past it (300 MiB here)


def _import(library: str):
    try:
        return __import__(library)
    except ImportError as e:
        _common.skip(f"{library} is not installed: {e}")


def _best_seconds(fn, budget: float = MATMUL_BUDGET_SECONDS, at_least: int = 3) -> float:
    """Best of repeated calls for ~`budget` seconds: a peak, not a typical value."""
    best, count = float("inf"), 0
    deadline = time.perf_counter() + budget
    while count < at_least or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        count += 1
    return best


def _matmul(library: str, dtype: str):
    """A no-argument n x n product in `library` and `dtype` (synchronised), or a skip."""
    if library == GPU_LIBRARY:
        return _cuda_matmul(dtype)
    lib = _import(library)
    n = MATMUL_N
    if library == "numpy":
        if dtype != "float32":  # bfloat16 does not exist; float16 has no BLAS kernel (far too slow a product)
            _common.skip(f"numpy {dtype}: no BLAS kernel, so no peak to measure")
        rng = lib.random.default_rng(0)
        a, b = (rng.standard_normal((n, n), dtype=lib.float32) for _ in range(2))  # (n, n) each
        return lambda: a @ b  # (n, n)
    if library == "torch":
        _threads.limit()
        a, b = (lib.randn(n, n, dtype=getattr(lib, dtype)) for _ in range(2))  # (n, n) each
        return lambda: lib.mm(a, b)  # (n, n)
    import jax.numpy as jnp

    _threads.pin_xla()  # one thread, as the attention benchmarks run it
    cpu = lib.devices("cpu")[0]  # the CPU's peak even where JAX's default device is a GPU
    a, b = (lib.device_put(jnp.ones((n, n), dtype=dtype, device=cpu), cpu) for _ in range(2))  # (n, n) each
    product = lib.jit(lambda x, y: x @ y)
    return lambda: product(a, b).block_until_ready()  # (n, n)


def _cuda():
    """torch with a CUDA device, or a skip."""
    torch = _import("torch")
    if not torch.cuda.is_available():
        _common.skip("no CUDA device")
    return torch


def _cuda_matmul(dtype: str):
    torch, n = _cuda(), GPU_MATMUL_N
    a, b = (torch.randn(n, n, dtype=getattr(torch, dtype), device="cuda") for _ in range(2))  # (n, n) each

    def product():
        torch.mm(a, b)  # (n, n)
        torch.cuda.synchronize()

    product.n = n
    return product


class PeakMatmul:
    """Best n x n matmul rate per library and dtype, GFLOP/s: the roofline's compute ceiling.

    The report's roof for a dtype is the best library's rate.  OPENBLAS_CORETYPE is a one-value
    parameter so results say which OpenBLAS kernel NumPy used (an older core type slows NumPy's
    BLAS; torch and XLA bring their own kernels)."""

    params = [["numpy", "torch", "jax", GPU_LIBRARY], ["float32", *_grid.SIXTEEN_BIT],
              [os.environ.get("OPENBLAS_CORETYPE", "unset")], [_common.THREADS]]
    param_names = ["library", "dtype", "openblas_coretype", "threads"]
    timeout = 120

    def setup(self, library, dtype, openblas_coretype, threads):
        try:
            self.product = _matmul(library, dtype)
            self.product()  # warm: thread pool start, compilation, first touch
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a dtype a library's CPU kernels lack
            _common.skip(f"{library} {dtype} matmul failed: {type(e).__name__}: {e}")

    def track_peak_gflops(self, library, dtype, openblas_coretype, threads):
        n = getattr(self.product, "n", MATMUL_N)
        return 2 * n ** 3 / _best_seconds(self.product) / 1e9

    track_peak_gflops.unit = "GFLOP/s"


class Bandwidth:
    """STREAM-style memory bandwidth, GB/s (1e9 bytes), one thread: the decode roof.

    copy: a = b (NumPy's copyto), 2 x 8 bytes per element moved; triad: a = b + s*c in one pass
    (torch.add with alpha; NumPy has no single-pass triad), 3 x 8 bytes.  STREAM's counting:
    write-allocate traffic is not counted.  Arrays of 16 MiB sit in the last-level cache, those of
    512 MiB do not (the VM's L3 is 300 MiB): a decode step's KV cache may be either."""

    params = [["copy", "triad", GPU_KERNEL], STREAM_MIB, [_common.THREADS]]
    param_names = ["kernel", "array_mib", "threads"]
    timeout = 120

    def setup(self, kernel, array_mib, threads):
        n = array_mib * 2 ** 20 // 8
        if kernel == "copy":
            import numpy as np

            a, b = np.zeros(n), np.ones(n)  # (n,) float64 each, pages touched
            self.kernel, self.bytes = (lambda: np.copyto(a, b)), 2 * 8 * n
        elif kernel == GPU_KERNEL:  # the same triad in the GPU's memory (16 MiB arrays fit an H200's L2)
            torch = _cuda()
            a, b, c = (torch.full((n,), x, dtype=torch.float64, device="cuda") for x in (0.0, 1.0, 1.0))  # (n,) each

            def triad():
                torch.add(b, c, alpha=3.0, out=a)
                torch.cuda.synchronize()

            self.kernel, self.bytes = triad, 3 * 8 * n
        else:
            torch = _import("torch")
            _threads.limit()
            a, b, c = torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64), torch.ones(
                n, dtype=torch.float64)  # (n,) each
            self.kernel, self.bytes = (lambda: torch.add(b, c, alpha=3.0, out=a)), 3 * 8 * n
        self.kernel()

    def track_bandwidth(self, kernel, array_mib, threads):
        return self.bytes / _best_seconds(self.kernel, budget=BANDWIDTH_BUDGET_SECONDS) / 1e9

    track_bandwidth.unit = "GB/s"


class Threads:
    """The threads every benchmark process computes with, as measured, not as asked for.

    blas / openmp: threadpoolctl's count for the loaded runtimes; torch: its intra-op pool;
    xla: how many threads accumulated CPU time during a jitted 1024^2 matmul (1 = the pin binds)."""

    params = [["blas", "openmp", "torch", "xla"]]
    param_names = ["library"]

    def setup(self, library):
        """A runtime no selected backend loads has no threads to count: a skip with the reason (asv
        skips a benchmark whose setup raises NotImplementedError; raised in the benchmark it fails)."""
        if library in ("torch", "xla"):
            _import("torch" if library == "torch" else "jax")
        if library in ("blas", "openmp"):
            self.counts = _threads.limit()
            if library not in self.counts:
                _common.skip(f"no {library} runtime loaded (threadpoolctl sees {sorted(self.counts) or 'none'})")

    def track_threads(self, library):
        if library == "torch":
            torch = _import("torch")
            _threads.limit()
            return torch.get_num_threads()
        if library == "xla":
            product = _matmul("jax", "float32")
            product()
            return _threads.busy_threads(product)
        return self.counts[library]

    track_threads.unit = "threads"


class _FidelityTime(bench_attention.TimeAttention):
    """The harness's own timing benchmark, pinned to the fidelity combination (not collected)."""

    params = [[FIDELITY["backend"]], [_grid.BATCH], [_grid.HEADS], [FIDELITY["T"]], [FIDELITY["E"]], [FIDELITY["op"]],
              [FIDELITY["dtype"]], list(_common.CLOCKS)]


def _harness_seconds(clock: str) -> float:
    """Median seconds per call as asv-runner's TimeBenchmark measures it, in this process."""
    from asv_runner.benchmarks.time import TimeBenchmark

    instance = _FidelityTime()
    func = instance.time_attention
    bench = TimeBenchmark("bench_machine._FidelityTime.time_attention", func, [func, instance, sys.modules[__name__]])
    bench.set_param_idx(_common.CLOCKS.index(clock))
    if bench.do_setup():
        _common.skip(f"{FIDELITY['backend']} skipped (see log)")
    try:
        return statistics.median(bench.do_run()["samples"])
    finally:
        bench.do_teardown()


class Fidelity:
    """torch-sdpa-cpu at T=2048: the harness's time against torch.utils.benchmark.Timer.

    Both time the same prepared callable in the same process with the same clock (CPU time or
    wall), interleaved three times so a load change on the machine hits both; the ratio is
    harness / Timer (1.0 = agreement).  The default grid checks the clock it times with."""

    params = [[FIDELITY["backend"]], [FIDELITY["T"]], [FIDELITY["E"]],
              list(_common.CLOCKS) if _grid.GRID == "full" else [_common.CLOCK]]
    param_names = ["backend", "T", "E", "clock"]
    timeout = 300

    def setup(self, backend, T, E, clock):
        workload = bench_attention.sweep(T, E)
        self.prepared = _common.prepared(backend, workload, FIDELITY["op"], FIDELITY["dtype"])
        import torch.utils.benchmark as torch_benchmark  # the backend loaded torch already

        self.torch_timer = torch_benchmark.Timer(
            stmt="run()", globals={"run": self.prepared.run}, num_threads=_common.THREADS,
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
