"""Thread pools and frameworks of a benchmark process: one count for every pool, fixed early.

Imported first by benchmarks/_common.py, before NumPy.  The count (ATTNSPEC_THREADS, default 1)
goes to the environment variables OpenMP/OpenBLAS/MKL read when they load, and through
threadpoolctl to every BLAS and OpenMP runtime already loaded (asv-runner imports NumPy before
the benchmarks, so OPENBLAS_NUM_THREADS alone came too late: a "1-thread" run used 2 BLAS
threads).  Call `limit()` again after a framework loads its own runtime (torch's libgomp).

XLA (jax 0.10.2, CPU): no flag binds.  Measured on the 2-core VM (a jitted 1024^2 matmul and a
T=2048 attention; per-thread CPU ticks from /proc/self/task): with no flag, with
--xla_cpu_multi_thread_eigen=false, and with the intra_op_parallelism_threads=1 this module used
to pass, 3-4 threads each accumulate CPU time.  What binds: XLA sizes its CPU client's pool
from the process's CPU affinity when the client is created, so `pin_xla()` restricts the
affinity to one CPU while JAX creates its client, then restores it: one thread does all the
work (bench_machine.Threads measures this in every run: busy_xla_threads).
"""
from __future__ import annotations

import os
import sys

THREADS = int(os.environ.get("ATTNSPEC_THREADS") or 1)
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))

# The framework each built-in adapter module loads in `load()`; anything else counts as NumPy
# (or is a plug-in, whose own module is imported when it is resolved).
FRAMEWORKS = {"torch_backends": ("torch",), "torch_cuda_backends": ("torch",), "flex_backends": ("torch",),
              "jax_backends": ("jax",), "onnx_backends": ("onnx", "onnxruntime"), "openvino_backends": ("openvino",),
              "keras_backends": ("keras", "torch", "jax"), "flax_backends": ("jax", "flax"),
              "transformers_backends": ("torch", "transformers"), "mlx_backends": ("mlx.core",)}
# What the fork server imports besides: the submodules a backend's load() or first call imports past
# its framework's top level (FlexAttention's compiler stack; transformers' lazily loaded model files;
# flax's nnx, which brings treescope and IPython; each Keras backend's nn module).  Left to the child,
# every forked combination imports them again, untimed but paid (what it costs: docs/measurements.md).
PRELOAD_EXTRA = {"flex_backends": ("torch._dynamo", "torch._inductor.compile_fx", "torch.nn.attention.flex_attention"),
                 "transformers_backends": ("transformers.integrations.sdpa_attention",
                                           "transformers.models.gemma2.modeling_gemma2",
                                           "transformers.models.gpt_oss.modeling_gpt_oss"),
                 "flax_backends": ("flax.linen", "flax.nnx"),
                 "keras_backends": ("keras.src.backend.numpy.nn", "keras.src.backend.jax.nn", "keras.src.backend.torch.nn")}


def limit() -> dict:
    """Every loaded BLAS/OpenMP pool to THREADS; returns {user_api: threads} as threadpoolctl sees them."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:  # the bench extra has it; without it only the variables above apply
        return {}
    threadpool_limits(limits=THREADS)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)  # torch's intra-op pool is its own, not an OpenMP setting
    counts: dict = {}
    for pool in threadpool_info():
        api = pool.get("user_api") or pool.get("internal_api")
        counts[api] = max(counts.get(api, 0), int(pool.get("num_threads") or 0))
    return counts


# the suite's too: under asv HOME is the process's own folder (attnspec/asvtool.py), XDG_CACHE_HOME the user's
JAX_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                         "attnspec", "jax")


def pin_xla() -> None:
    """Create JAX's CPU client with a one-CPU affinity (its pool gets one thread), then restore.

    Also points JAX at the persistent compilation cache the conformance suite uses: every asv
    combination is a fresh process that would otherwise compile its function again each run."""
    jax = sys.modules.get("jax")
    if jax is None:
        return
    try:
        os.makedirs(JAX_CACHE, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except Exception as e:  # noqa: BLE001 - an older JAX: compiles every time, measures the same
        print(f"attnspec-bench: no JAX compilation cache: {e}", file=sys.stderr)
    if THREADS != 1 or not hasattr(os, "sched_setaffinity"):
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        jax.devices()  # creates the clients: the pool sizes itself from the affinity now
    finally:
        os.sched_setaffinity(0, allowed)


def busy_threads(work, seconds: float = 0.3) -> int:
    """How many of this process's threads accumulate CPU time while `work()` repeats (Linux)."""
    import time

    def ticks() -> dict:
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                out[tid] = int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
            except OSError:  # the thread ended meanwhile
                pass
        return out

    before = ticks()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work()
    after = ticks()
    spent = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
    # a thread counts when it did at least a quarter of the busiest one's work: XLA's compute
    # threads share a product about evenly; the Python thread that dispatches does far less
    return sum(1 for s in spent if spent and s > 0 and s >= 0.25 * spent[0])


def frameworks_of(names) -> list[str]:
    """The frameworks the named backends load: a built-in's by its module; for a plug-in, torch
    and jax where installed (its own module is not run in the fork server: one that creates a
    CUDA context or a JAX client at import would break every forked benchmark)."""
    import importlib.util

    out = []
    for name in names:
        adapter = _adapter(name)
        if adapter is not None:
            out += FRAMEWORKS.get(adapter, ())
        else:
            out += [m for m in ("torch", "jax") if importlib.util.find_spec(m) is not None]
    return list(dict.fromkeys(out))


def _adapter(name: str) -> str | None:
    """A built-in's adapter module ("flex_backends"); None for a plug-in."""
    from attnspec.backends import registry

    target = registry.BUILTINS.get(name)
    return None if target is None else target.partition(":")[0].rsplit(".", 1)[-1]


def preload(names) -> list[str]:
    """Import the frameworks of `names` now (in asv's fork server: every benchmark forks from it).

    Importing torch, jax, onnxruntime or openvino takes seconds per process; imported once in the
    server, each forked benchmark starts without it (docs/measurements.md).  Only imports: no JAX client, no torch
    parallel region, no CUDA context - the state that is unsafe to fork is created in the child.
    """
    import importlib

    extra = [m for name in names for m in PRELOAD_EXTRA.get(_adapter(name), ())]
    os.environ.setdefault("KERAS_BACKEND", "numpy")  # keras' default backend, TensorFlow, is not installed
    loaded = []
    for module in dict.fromkeys(frameworks_of(names) + extra):
        try:
            importlib.import_module(module)
            loaded.append(module)
        except Exception as e:  # noqa: BLE001 - the benchmark's own setup reports the reason
            print(f"attnspec-bench: preload {module}: {type(e).__name__}: {e}", file=sys.stderr)
    limit()
    return loaded
