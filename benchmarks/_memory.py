"""The extra bytes one attention call needs, measured the way each framework allows.

`peakmem_` would count the interpreter and every imported framework; here only the call counts:
the peak while it runs minus what was live before it (inputs excluded, the output included).

- NumPy arrays: tracemalloc. NumPy reports every data buffer to tracemalloc, so the traced peak
  is exactly the bytes the call held at once (byte-exact, no page rounding).
- JAX arrays: XLA's compiled memory analysis of the same computation under `jax.jit`:
  temp + output - aliased bytes, i.e. what the executable allocates beyond its arguments.
  (The CPU client has no allocator statistics; this is XLA's plan, not a sampled peak.)
- PyTorch on CUDA: torch.cuda.reset_peak_memory_stats, then max_memory_allocated after the call
  minus memory_allocated before it (the caching allocator's own count: exact, device memory).
- JAX on a GPU: the device's memory_stats(): peak_bytes_in_use after the call minus bytes_in_use
  before it.  JAX cannot reset the peak, but setup already ran the same call, so the peak holds
  this call's; without stats (the CPU client has none) XLA's plan above.
  (These two run only with a GPU: none on the dev VM, so they are untested there.)
- Anything else (PyTorch CPU, third-party backends): Linux peak-RSS reset. Free heap goes back
  to the OS (malloc_trim), writing "5" to /proc/self/clear_refs resets VmHWM to the current RSS,
  then VmHWM after the call minus the RSS before it. Page-granular (4 KiB) and it sees every
  thread, so it is noisy below ~1 MB; large T is what the scaling fits use.
"""
from __future__ import annotations

import ctypes
import gc
import sys
import tracemalloc

import numpy as np


def native_kind(backend, dtype: str) -> str:
    """'numpy', 'jax' or 'other', from the type the backend converts inputs to."""
    module = type(backend.to_native(np.zeros((1, 1)), dtype)).__module__
    if module.startswith("numpy"):
        return "numpy"
    if module.startswith(("jax", "jaxlib")):
        return "jax"
    return "other"


def method_for(backend, dtype: str) -> str:
    kind, device = native_kind(backend, dtype), backend.capabilities.device
    if device == "cuda" and "torch" in sys.modules:
        return "cuda-max-memory-allocated"
    if kind == "jax" and device == "gpu":
        return "jax-device-memory-stats"
    return {"numpy": "tracemalloc", "jax": "xla-memory-analysis"}.get(kind, "rss-peak-reset")


def extra_bytes(backend, run, inputs: tuple, op: str, dtype: str) -> int:
    """Bytes one call of `run` needs beyond its (already converted) inputs."""
    method = method_for(backend, dtype)
    if method == "tracemalloc":
        return traced_peak(run)
    if method == "cuda-max-memory-allocated":
        return cuda_peak(run)
    if method == "jax-device-memory-stats":
        measured = jax_device_peak(backend, run)
        if measured is not None:
            return measured
        method = "xla-memory-analysis"
    if method == "xla-memory-analysis":
        measured = xla_extra(backend, inputs, op, dtype)
        if measured is not None:
            return measured
    return rss_peak(run)


def traced_peak(run) -> int:
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = run()  # noqa: F841 - the output stays alive: it is part of what the call needs
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return int(peak - before)


def xla_extra(backend, inputs: tuple, op: str, dtype: str) -> int | None:
    """XLA's plan for the jitted call, or None when the platform gives no analysis."""
    jax = sys.modules["jax"]
    args = backend._inputs(dtype, *inputs)  # q, k, v, grad_out, native, in the backend's axis order
    if op == "forward":
        fn, args = (lambda q, k, v: backend.native_forward(q, k, v, None, False, None)), args[:3]
    else:
        fn = lambda q, k, v, g: backend.native_backward(q, k, v, g, None, False, None)  # noqa: E731
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    if analysis is None:
        return None
    return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)


def cuda_peak(run) -> int:
    torch = sys.modules["torch"]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = run()  # noqa: F841 - run() syncs; the output stays alive, as the other methods count it
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def jax_device_peak(backend, run) -> int | None:
    device = backend.jax_device
    stats = device.memory_stats() if device is not None else None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    before = stats["bytes_in_use"]
    result = run()  # noqa: F841
    return int(device.memory_stats()["peak_bytes_in_use"] - before)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise NotImplementedError(f"/proc/self/status has no {field}")


def rss_peak(run) -> int:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError as e:
        raise NotImplementedError(f"peak-RSS reset needs Linux glibc: {e}") from None
    gc.collect()
    libc.malloc_trim(0)  # freed heap back to the OS, or the call could reuse it unseen
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # VmHWM := current RSS
    except OSError as e:
        raise NotImplementedError(f"cannot reset the peak RSS (/proc/self/clear_refs): {e}") from None
    before = _status_kib("VmRSS")
    result = run()  # noqa: F841 - keep the output alive, as the other methods count it
    peak = _status_kib("VmHWM")
    return max(0, peak - before) * 1024
