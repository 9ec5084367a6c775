"""What every attention benchmark shares: the parameter grid, the inputs and the prepared call.

asv runs each parameter combination in a fresh process (launch_method "spawn") and, with a
`setup` hook present, re-runs `setup` before every timed call (asv-runner >= 0.3), so
`prepared()` caches the converted inputs and the warmed-up callable per combination: the
re-run is a dict lookup and conversion, compilation and warm-up stay out of the timed region.
Importing this module loads no framework; a backend imports its own when first prepared.
"""
from __future__ import annotations

import os
import sys
import time

# Thread counts are fixed before NumPy (through backends) is imported, so every process of a
# run uses the same pools. Default 1: on a shared 2-core VM two BLAS/OpenMP threads stall at
# every barrier while another process holds a core (torch at T=16: 16 ms a call instead of
# 70 us; numpy-naive at T=512: 5x slower, 30x spread), one thread only slows in proportion.
# On a dedicated machine set ATTNSPEC_THREADS=$(nproc).
THREADS = int(os.environ.get("ATTNSPEC_THREADS") or 1)
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))
if THREADS == 1:  # asks XLA's CPU client for one intra-op thread too (read when jax loads)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402


def blas_threads(set_to: int | None = None) -> int | None:
    """OpenBLAS's thread count (set first if asked), through the loaded library.

    OpenBLAS reads OPENBLAS_NUM_THREADS once, when it loads, and asv-runner has usually loaded
    NumPy before this module (its mem_ support imports pympler, which imports NumPy), so the
    variable above is not enough: without this call a "1-thread" run used 2 BLAS threads."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:  # not Linux: leave BLAS alone, report unknown
        return None
    count = None
    for path in paths:
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                getter = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                setter = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                if getter is None or setter is None:
                    continue
                if set_to is not None:
                    setter(ctypes.c_int(set_to))
                count = int(getter())
    return count


blas_threads(THREADS)

# asv (environment "existing") installs nothing: measure the checkout these benchmarks sit in,
# not whatever copy of attnspec the interpreter has installed.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from backends import registry  # noqa: E402
from backends.base import BackendUnavailable, Unsupported  # noqa: E402

# The clock of time_attention. "process" = the process's CPU time (time.process_time): with one
# thread it is the call's compute time, blind to waiting for a core, which on a shared VM under
# load 6-8 made wall-clock medians of numpy-naive flat from T=256 to 2048. "wall" = perf_counter,
# the latency, right on a quiet machine and for GPU backends (CPU time misses device work).
CLOCKS = ("process", "wall")
CLOCK = os.environ.get("ATTNSPEC_CLOCK") or ("process" if THREADS == 1 else "wall")
if CLOCK not in CLOCKS:
    raise ValueError(f"ATTNSPEC_CLOCK={CLOCK!r}: expected one of {', '.join(CLOCKS)}")

BATCH, HEADS = 1, 8  # fixed so T and E are the only size axes; recorded as one-value params
SEED = 20240601


def _int_list(var: str, default: list[int]) -> list[int]:
    """A comma-separated list of positive ints from `var` (to shrink the grid for smoke runs)."""
    text = os.environ.get(var)
    if not text:
        return default
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{var}={text!r}: expected comma-separated integers, e.g. 4,64") from None
    if not values or min(values) < 1:
        raise ValueError(f"{var}={text!r}: expected positive integers")
    return values


def _installed_builtins() -> list[str]:
    """Every built-in whose framework is installed and whose device seems present.

    Checked without importing a framework: asv imports this module in every spawned process,
    and importing torch and jax there would add seconds to each of the sweep's ~600 processes.
    The device check is a cheap look for an NVIDIA device node; where it guesses wrong, the
    backend's setup still raises NotImplementedError with the real reason (a skip).
    """
    import importlib.util
    import inspect

    gpu = os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")
    names = []
    for name in registry.builtin_names():
        module, _, attr = registry.BUILTINS[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)  # adapters import no framework
        framework = {"torch_backends": "torch", "jax_backends": "jax"}.get(module.rsplit(".", 1)[-1], "numpy")
        device = cls.capabilities.device if inspect.isclass(cls) else "cpu"
        if importlib.util.find_spec(framework) is not None and (device == "cpu" or gpu):
            names.append(name)
    return names


def backend_names() -> list[str]:
    """ATTNSPEC_BACKENDS (the plug-in contract), else every installed built-in.

    The full sweep over the 8 CPU built-ins took 13 min 6 s on the 2-core dev VM (asv spawns a
    process per combination; a torch or jax process costs ~1.5 s before it measures anything).
    """
    names = registry.names_from_env()
    return list(names or _installed_builtins())


T_VALUES = _int_list("ATTNSPEC_BENCH_T", [2 ** i for i in range(2, 12)])  # 4 ... 2048
E_VALUES = _int_list("ATTNSPEC_BENCH_E", [16, 64, 128])
OPS = [x.strip() for x in os.environ.get("ATTNSPEC_BENCH_OPS", "forward,forward_backward").split(",") if x.strip()]
DTYPES = [x.strip() for x in os.environ.get("ATTNSPEC_BENCH_DTYPES", "float32").split(",") if x.strip()]

PARAM_NAMES = ["backend", "batch", "heads", "T", "E", "op", "dtype"]


# Extra memory hardly depends on E (the O(T^2) score block does not); one E halves the spawns.
MEMORY_E_VALUES = [64] if 64 in E_VALUES else E_VALUES[:1]


def params(e_values=None) -> list[list]:
    return [backend_names(), [BATCH], [HEADS], T_VALUES, e_values or E_VALUES, OPS, DTYPES]


def timer_for(backend, clock: str):
    """The function asv times with: CPU time only where the work runs on this process's CPU."""
    if clock == "process" and backend.capabilities.device == "cpu":
        return time.process_time
    return time.perf_counter


def log(message: str) -> None:
    """asv keeps a benchmark's stderr in its log: say why a combination is skipped."""
    print(f"attnspec-bench: {message}", file=sys.stderr)


class Prepared:
    """One combination, converted and warmed up: `run()` is the timed call."""

    def __init__(self, backend, inputs: tuple, run, call_seconds: float):
        self.backend = backend
        self.inputs = inputs  # float64 NumPy (q, k, v, grad_out)
        self.run = run
        self.call_seconds = call_seconds  # a warm call, to size asv's `number`


_CACHE: dict[tuple, Prepared] = {}
_BACKENDS: dict[str, object] = {}


def inputs(batch: int, heads: int, T: int, E: int) -> tuple:
    rng = np.random.default_rng(SEED)
    q, k, v, grad_out = (rng.standard_normal((batch, heads, T, E)) for _ in range(4))  # (B, H, T, E)
    return q, k, v, grad_out


def get_backend(name: str):
    """The backend, loaded; NotImplementedError (asv's skip) with the reason if it cannot load."""
    if name not in _BACKENDS:
        backend = registry.resolve(name)
        ok, why = backend.availability()
        if not ok:
            log(f"skip {name}: {why}")
            raise NotImplementedError(f"{name} unavailable: {why}")
        _fix_framework_threads()
        _BACKENDS[name] = backend
    return _BACKENDS[name]


def _fix_framework_threads() -> None:
    """Frameworks with their own pool get the same thread count as BLAS."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)


def prepared(name, batch, heads, T, E, op, dtype, time_warm_call=True) -> Prepared:
    """Converted, warmed up and cached; `time_warm_call=False` skips the second (sizing) call."""
    key = (name, batch, heads, T, E, op, dtype)
    if key in _CACHE:
        return _CACHE[key]
    backend = registry.resolve(name) if name not in _BACKENDS else _BACKENDS[name]
    caps = backend.capabilities  # declared on the class: no framework import to skip a combination
    if dtype not in caps.dtypes or (op == "forward_backward" and not caps.gradients):
        why = f"{name} declares dtypes {caps.dtypes}, gradients={caps.gradients}"
        log(f"skip {name} {op} {dtype}: {why}")
        raise NotImplementedError(why)
    backend = get_backend(name)
    q, k, v, grad_out = inputs(batch, heads, T, E)
    try:
        run = backend.prepare(q, k, v, None, False, None, dtype=dtype, op=op)
    except Unsupported as e:  # includes BackendUnavailable
        log(f"skip {name} {op} {dtype}: {e}")
        raise NotImplementedError(str(e)) from None
    start = time.perf_counter()
    run()  # first call: compilation, lazy allocation, first touch - never timed
    call_seconds = time.perf_counter() - start
    if time_warm_call and call_seconds < 1.0:  # the first call may hold one-off init: time a warm one
        start = time.perf_counter()
        run()
        call_seconds = time.perf_counter() - start
    _CACHE[key] = Prepared(backend, (q, k, v, grad_out), run, call_seconds)
    return _CACHE[key]


__all__ = ["BATCH", "HEADS", "THREADS", "PARAM_NAMES", "params", "prepared", "get_backend", "inputs",
           "log", "BackendUnavailable"]
